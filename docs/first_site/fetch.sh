curl http://127.0.0.1:8000/.well-known/resourcesync
curl http://127.0.0.1:8000/resourcesync/documents/resourcelist.xml
curl http://127.0.0.1:8000/resourcesync/documents/changelist.xml
