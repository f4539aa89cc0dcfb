"""The repository's own records in the admin: a manager edits an item (its title, whether it is
public, its files) and the sets that list it follow, through the app's signals."""

from django.contrib import admin

from .models import Collection, Item, ItemFile


@admin.register(Collection)
class CollectionAdmin(admin.ModelAdmin):
    list_display = ["name", "slug"]
    prepopulated_fields = {"slug": ["name"]}
    search_fields = ["name"]


class ItemFileInline(admin.TabularInline):
    model = ItemFile
    extra = 0
    fields = ["name", "file", "media_type"]


@admin.register(Item)
class ItemAdmin(admin.ModelAdmin):
    list_display = ["title", "collection", "creator", "is_public", "modified"]
    list_filter = ["is_public", "collection"]
    search_fields = ["title", "creator"]
    inlines = [ItemFileInline]


@admin.register(ItemFile)
class ItemFileAdmin(admin.ModelAdmin):
    list_display = ["name", "item", "media_type", "modified"]
    search_fields = ["name"]
    list_select_related = ["item"]
