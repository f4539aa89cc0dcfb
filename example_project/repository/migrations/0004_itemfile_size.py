"""The size of each file, recorded on the row: the ResourceSync fingerprint of a file reads it in the
database instead of asking the storage. The sizes of the files already there are read through their
storage, a batch at a time (on S3 from its listing, a request per 1,000 files rather than one per
file); a file missing from the storage keeps no size."""

from django.db import migrations, models

BATCH = 2000


def fill_sizes(apps, schema_editor):
    from django_resourcesync.listing import FileSizes

    ItemFile = apps.get_model("repository", "ItemFile")
    using = schema_editor.connection.alias
    sizes = FileSizes(ItemFile._meta.get_field("file").storage)
    rows = ItemFile.objects.using(using).filter(size__isnull=True).exclude(file="").order_by("pk")
    last = None
    while True:
        page = rows if last is None else rows.filter(pk__gt=last)
        batch = list(page.values_list("pk", "file")[:BATCH])
        if not batch:
            return
        last = batch[-1][0]
        sizes.prepare(name for _pk, name in batch)
        found = []
        for pk, name in batch:
            try:
                found.append(ItemFile(pk=pk, size=sizes.size(name)))
            except Exception:  # missing (OSError on a disk, the client's own error on S3), refused name
                continue
        if found:
            ItemFile.objects.using(using).bulk_update(found, ["size"])
        sizes.known.clear()  # the sizes of one batch at a time in memory


class Migration(migrations.Migration):
    dependencies = [("repository", "0003_landing_pages")]
    operations = [
        migrations.AddField(
            model_name="itemfile",
            name="size",
            field=models.BigIntegerField(
                blank=True, editable=False, null=True,
                help_text="The file's size in bytes, recorded when the file is saved (empty where it could not be read).",
            ),
        ),
        migrations.RunPython(fill_sizes, migrations.RunPython.noop),
    ]
