"""Start gcp-storage-emulator (PyPI) with the parts of the GCS XML API that object_store reads.

The emulator serves objects at /BUCKET/OBJECT but, unlike GCS, sends no ETag or Last-Modified
there, has no HEAD, ignores If-Match and If-Unmodified-Since, and cannot list a bucket through the
XML API. This launcher adds exactly those (an ETag from the object's MD5 and generation, its
`updated` time as Last-Modified, 412 on a failed precondition, HEAD with the object's length, and
`GET /BUCKET?list-type=2`), then runs the emulator's own command line with the arguments given.
Storage, uploads and ranged reads stay the emulator's.
"""

import datetime
import email.utils
import sys
from http import HTTPStatus
from xml.sax.saxutils import escape

from gcp_storage_emulator import server
from gcp_storage_emulator.__main__ import main
from gcp_storage_emulator.exceptions import NotFound
from gcp_storage_emulator.handlers import objects

HEAD = "HEAD"


def _version(obj):
    etag = '"{}-{}"'.format(obj.get("md5Hash", ""), obj.get("generation", ""))
    updated = datetime.datetime.fromisoformat(obj["updated"].replace("Z", "+00:00"))
    return etag, updated.astimezone(datetime.timezone.utc)


def _precondition_failed(request, etag, updated):
    if_match = request.get_header("If-Match", None)
    if if_match is not None and if_match != etag:
        return True
    since = request.get_header("If-Unmodified-Since", None)
    if since is not None:
        limit = email.utils.parsedate_to_datetime(since)
        if updated.replace(microsecond=0) > limit:
            return True
    return False


_download = objects.download
_xml_upload = objects.xml_upload


def download(request, response, storage, *args, **kwargs):
    bucket, name = request.params["bucket_name"], request.params["object_id"]
    try:
        obj = storage.get_file_obj(bucket, name)
    except NotFound:
        response.status = HTTPStatus.NOT_FOUND
        return
    etag, updated = _version(obj)
    if _precondition_failed(request, etag, updated):
        response.status = HTTPStatus.PRECONDITION_FAILED
        return
    response["ETag"] = etag
    response["Last-Modified"] = email.utils.format_datetime(updated, usegmt=True)
    if request.method == HEAD:
        response.head_length = int(obj["size"])
        return
    _download(request, response, storage, *args, **kwargs)


def xml_upload(request, response, storage, *args, **kwargs):
    _xml_upload(request, response, storage, *args, **kwargs)
    if response.status == HTTPStatus.OK:
        obj = storage.get_file_obj(request.params["bucket_name"], request.params["object_id"])
        etag, updated = _version(obj)
        response["ETag"] = etag
        response["Last-Modified"] = email.utils.format_datetime(updated, usegmt=True)


def list_objects(request, response, storage, *args, **kwargs):
    """ListObjectsV2-style XML, every object in one page."""
    bucket = request.params["bucket_name"]
    prefix = (request.query.get("prefix") or [""])[0]
    delimiter = (request.query.get("delimiter") or [None])[0]
    try:
        listed = storage.get_file_list(bucket, prefix or None, delimiter)
    except NotFound:
        response.status = HTTPStatus.NOT_FOUND
        return
    files, prefixes = listed if isinstance(listed, tuple) else (listed, [])
    parts = ['<?xml version="1.0" encoding="UTF-8"?><ListBucketResult>']
    parts.append("<Name>{}</Name><Prefix>{}</Prefix><IsTruncated>false</IsTruncated>".format(
        escape(bucket), escape(prefix)))
    for obj in files:
        etag, updated = _version(obj)
        parts.append(
            "<Contents><Key>{}</Key><LastModified>{}</LastModified><ETag>{}</ETag>"
            "<Size>{}</Size></Contents>".format(
                escape(obj["name"]), updated.strftime("%Y-%m-%dT%H:%M:%S.%fZ"), escape(etag), obj["size"]))
    for p in prefixes:
        parts.append("<CommonPrefixes><Prefix>{}</Prefix></CommonPrefixes>".format(escape(p)))
    parts.append("</ListBucketResult>")
    response["Content-type"] = "application/xml"
    response._content = "".join(parts)


_close = server.Response.close


def close(self):
    """A HEAD answer: the object's length in Content-Length, no body."""
    length = getattr(self, "head_length", None)
    if length is None:
        return _close(self)
    self._handler.send_response(self.status.value, self.status.phrase)
    for k, v in self._headers.items():
        self._handler.send_header(k, v)
    self._handler.send_header("Content-Length", str(length))
    self._handler.end_headers()


def patch():
    server.Response.close = close
    server.RequestHandler.do_HEAD = lambda self: server.Router(self).handle(HEAD)
    handlers = []
    for regex, methods in server.HANDLERS:
        if methods.get(server.GET) is _download:
            methods = dict(methods, **{server.GET: download, HEAD: download})
        if methods.get(server.PUT) is _xml_upload:
            methods = dict(methods, **{server.PUT: xml_upload})
        handlers.append((regex, methods))
    handlers.append((r"^/(?P<bucket_name>[-.\w]+)$", {server.GET: list_objects}))
    server.HANDLERS = tuple(handlers)


if __name__ == "__main__":
    patch()
    sys.exit(main(sys.argv[1:]))
