python manage.py shell -c "
from django_resourcesync.models import ResourceSet
ResourceSet.objects.create(
    name='Documents', slug='documents', source='documents', capabilities=['resourcelist', 'changelist'],
)
"
