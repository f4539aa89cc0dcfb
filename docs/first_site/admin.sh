python manage.py createsuperuser
