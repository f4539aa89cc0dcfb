"""Files read and hashed ahead on threads (``ResourceSource.read_ahead``) give what reading
them one by one gives, fail the same way, and are not read ahead where the source or its
storage reads its bytes its own way."""

import hashlib

import pytest
from django.core.files.base import ContentFile
from django.core.files.storage import FileSystemStorage
from django.db.models.fields.files import FieldFile, FileField

from django_resourcesync import sources
from django_resourcesync.sources import ResourceSource, UnpublishableResource


class Thing:
    def __init__(self, pk):
        self.pk = pk

    def __repr__(self):
        return f"<Thing {self.pk}>"


def _field(storage):
    field = FileField(storage=storage)
    field.name = "file"
    return field


def _source(field, raising=()):
    class FileSource(ResourceSource):
        def file(self, obj):
            if obj.pk in raising:
                raise ValueError("a file the site cannot name")
            return FieldFile(obj, field, f"{obj.pk}.bin")

        def media_type(self, obj):
            return "application/pdf" if obj.pk == 4 else None

    return FileSource()


def test_files_read_ahead_are_hashed_as_when_read_one_by_one(tmp_path, monkeypatch):
    monkeypatch.setattr(sources, "READ_AHEAD_CHUNK", 4)  # several tasks, one of them short
    big = bytes(range(256)) * (sources.READ_CHUNK // 128 + 3)  # more than two chunks
    for pk in range(0, 30, 2):
        (tmp_path / f"{pk}.bin").write_bytes(big if pk == 10 else b"x" * pk)  # odd numbers: missing
    source = _source(_field(FileSystemStorage(location=str(tmp_path))), raising={7})
    things = [Thing(pk) for pk in range(30)]

    ahead = source.read_ahead(things)

    assert set(ahead) == {str(pk) for pk in range(30) if pk != 7}  # 7: reported where it is read
    for thing in things:
        if thing.pk == 7:
            continue
        fresh = Thing(thing.pk)
        if thing.pk % 2:
            with pytest.raises(UnpublishableResource) as expected:
                source.representation(fresh)
            with pytest.raises(UnpublishableResource) as found:
                ahead[str(thing.pk)].representation(thing)
            assert str(found.value) == str(expected.value)
            continue
        assert ahead[str(thing.pk)].representation(thing) == source.representation(fresh)
    got = ahead["10"].representation(things[10])
    assert (got.md5, got.sha256, got.length) == (
        hashlib.md5(big).hexdigest(), hashlib.sha256(big).hexdigest(), len(big)
    )


def test_bytes_read_another_way_are_not_read_ahead(tmp_path):
    (tmp_path / "1.bin").write_bytes(b"stored")

    class Reversing(FileSystemStorage):
        """Serves each file's bytes reversed: what it opens is not the file on disk."""

        def _open(self, name, mode="rb"):
            return ContentFile(super()._open(name, mode).read()[::-1], name=name)

    plain = _source(_field(FileSystemStorage(location=str(tmp_path))))
    reversing = _source(_field(Reversing(location=str(tmp_path))))
    thing = Thing(1)
    assert set(plain.read_ahead([thing])) == {"1"}
    assert reversing.read_ahead([thing]) == {}
    assert reversing.representation(thing).md5 == hashlib.md5(b"derots").hexdigest()

    class OwnBytes(type(plain)):
        def bitstream(self, obj):
            return iter([b"other"]), None

    assert OwnBytes().read_ahead([thing]) == {}
    opened = FieldFile(thing, _field(FileSystemStorage(location=str(tmp_path))), "1.bin")
    opened.open("rb")  # a file the object already has open is read as it is
    try:
        assert not sources._reads_as_opened(opened)
    finally:
        opened.close()
