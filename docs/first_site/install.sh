pip install django-resourcesync
