from django.http import HttpResponse
from django.shortcuts import get_object_or_404

from .models import Document


def document(request, pk):
    """A document's text, shown only while the document is public."""
    doc = get_object_or_404(Document, pk=pk, is_public=True)
    return HttpResponse(doc.text.encode(), content_type="text/plain; charset=utf-8")
