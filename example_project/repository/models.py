"""A small institutional repository: collections of items, each with files (bitstreams)."""

from django.db import models
from django.urls import NoReverseMatch

from django_resourcesync.uris import PathReverser

# reverse() of these names, learnt once: describing a changed file makes three of its URLs.
item_path = PathReverser("repository:item")
item_metadata_path = PathReverser("repository:item-metadata")
file_path = PathReverser("repository:file")


class Collection(models.Model):
    name = models.CharField(max_length=200)
    slug = models.SlugField(unique=True)
    description = models.TextField(blank=True)

    def __str__(self):
        return self.name


class Item(models.Model):
    collection = models.ForeignKey(Collection, on_delete=models.PROTECT, related_name="items")
    title = models.CharField(max_length=500)
    creator = models.CharField(max_length=200, blank=True)
    abstract = models.TextField(blank=True)
    is_public = models.BooleanField(default=True)
    created = models.DateTimeField(auto_now_add=True)
    modified = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["pk"]

    def __str__(self):
        return self.title

    def get_absolute_url(self):
        return item_path(pk=self.pk)

    def get_metadata_url(self):
        return item_metadata_path(pk=self.pk)


def item_file_path(instance, filename):
    return f"items/{instance.item_id}/{filename}"


class ItemFile(models.Model):
    """A file (bitstream) of an item, served at a URL that ends in its original file name."""

    item = models.ForeignKey(Item, on_delete=models.CASCADE, related_name="files")
    name = models.CharField(max_length=255, help_text="The file name shown to users and used in the URL.")
    file = models.FileField(upload_to=item_file_path, max_length=500)
    media_type = models.CharField(max_length=255, blank=True)
    size = models.BigIntegerField(
        null=True, blank=True, editable=False,
        help_text="The file's size in bytes, recorded when the file is saved (empty where it could not be read).",
    )
    created = models.DateTimeField(auto_now_add=True)
    modified = models.DateTimeField(auto_now=True)

    class Meta:
        ordering = ["pk"]

    def __str__(self):
        return self.name

    def save(self, *args, **kwargs):
        # The size goes with the file: the ResourceSync fingerprint of the file reads it in the
        # database instead of asking the storage (see repository/resourcesync.py). Read on every
        # save (one stat, or a HEAD on S3: the bytes are read in full after a save anyway), so
        # that it also catches up with a file that was missing, or replaced, when last saved.
        if "file" not in self.get_deferred_fields():
            size = self.file_size()
            if size != self.size:
                self.size = size
                update_fields = kwargs.get("update_fields")
                if update_fields and "size" not in update_fields:
                    kwargs["update_fields"] = [*update_fields, "size"]
        super().save(*args, **kwargs)

    def file_size(self):
        """The size of the file in bytes (of a new upload too, before it is stored), or ``None``
        where there is no file or it cannot be read (missing from the storage)."""
        if not self.file:
            return None
        try:
            return self.file.size
        except Exception:  # missing (OSError on a disk, the client's own error on S3), refused name
            return None

    def get_absolute_url(self):
        return file_path(item=self.item_id, pk=self.pk, name=self.name)

    def public_url(self):
        """The file's URL, or ``None`` where its name cannot be part of one (a line break)."""
        try:
            return self.get_absolute_url()
        except NoReverseMatch:
            return None
