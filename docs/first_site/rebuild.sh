python manage.py resourcesync_rebuild
