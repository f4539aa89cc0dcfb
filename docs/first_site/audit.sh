python manage.py resourcesync_audit
