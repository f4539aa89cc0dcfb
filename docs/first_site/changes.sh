python manage.py shell -c "
from library.models import Document
Document.objects.create(title='Newsletter', text='News.', is_public=True)
minutes = Document.objects.get(title='Minutes')
minutes.text = 'We met, and agreed.'
minutes.save()
report = Document.objects.get(title='Annual report')
report.is_public = False
report.save()
Document.objects.get(title='Budget').delete()
"
