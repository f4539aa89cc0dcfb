python manage.py shell -c "
from library.models import Document
Document.objects.create(title='Annual report', text='Our year.', is_public=True)
Document.objects.create(title='Minutes', text='We met.', is_public=True)
Document.objects.create(title='Budget', text='Our sums.', is_public=True)
Document.objects.create(title='Draft', text='Not yet.')
"
