from django.db import models
from django.urls import reverse


class Document(models.Model):
    title = models.CharField(max_length=200)
    text = models.TextField()
    is_public = models.BooleanField(default=False)
    modified = models.DateTimeField(auto_now=True)

    def __str__(self):
        return self.title

    def get_absolute_url(self):
        return reverse("document", args=[self.pk])
