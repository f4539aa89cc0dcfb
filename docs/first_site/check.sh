python manage.py check
