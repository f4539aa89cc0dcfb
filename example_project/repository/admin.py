"""The repository's own records in the admin: a manager edits an item (its title, whether it is
public, its files) and the sets that list it follow, through the app's signals."""

from django import forms
from django.contrib import admin

from django_resourcesync.admin import NumbersInRange

from . import uploads
from .models import Collection, Item, ItemFile


@admin.register(Collection)
class CollectionAdmin(NumbersInRange, admin.ModelAdmin):
    list_display = ["name", "slug"]
    prepopulated_fields = {"slug": ["name"]}
    search_fields = ["name"]


class ItemFileForm(forms.ModelForm):
    """A file's media type, where given, is one (``type/subtype``): it is sent in a header and
    published in the Resource Lists, and decides whether the file is shown or downloaded."""

    class Meta:
        model = ItemFile
        fields = "__all__"
        help_texts = {
            "media_type": "Such as text/plain or application/pdf; empty, the file's name tells. Only plain "
            "text and images other than SVG are shown in the browser: other files are downloaded.",
        }

    def clean_media_type(self):
        value = self.cleaned_data["media_type"]
        return uploads.clean_media_type(value) if value else ""  # stripped by the field


class ItemFileInline(admin.TabularInline):
    model = ItemFile
    form = ItemFileForm
    extra = 0
    fields = ["name", "file", "media_type"]


@admin.register(Item)
class ItemAdmin(NumbersInRange, admin.ModelAdmin):
    list_display = ["title", "collection", "creator", "is_public", "modified"]
    list_filter = ["is_public", "collection"]
    search_fields = ["title", "creator"]
    inlines = [ItemFileInline]


@admin.register(ItemFile)
class ItemFileAdmin(NumbersInRange, admin.ModelAdmin):
    form = ItemFileForm
    list_display = ["name", "item", "media_type", "modified"]
    search_fields = ["name"]
    list_select_related = ["item"]
