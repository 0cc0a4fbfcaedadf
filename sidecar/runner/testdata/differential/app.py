"""The differential harness's Python upstream: Werkzeug's HTTP/1.1 server
and its URL map, as a Flask application routes. It records what it parsed
of every request and serves the records at GET /seen?from=N on a second,
control port. It prints "<port> <control port>" once both listen."""
import itertools
import json
import sys
import threading

from werkzeug.exceptions import HTTPException
from werkzeug.routing import Map, Rule
from werkzeug.serving import WSGIRequestHandler, make_server
from werkzeug.wrappers import Request, Response

URLS = Map([
    Rule("/_end", endpoint="end"),
    Rule("/once", endpoint="once", methods=["GET"]),  # Werkzeug adds HEAD
    Rule("/login", endpoint="login", methods=["POST"]),
    Rule("/admin", endpoint="admin"),
    Rule("/keyed", endpoint="keyed"),
    Rule("/deep/<path:rest>", endpoint="deep"),
    Rule("/", endpoint="other"),
    Rule("/<path:rest>", endpoint="other"),
])

seen = []
lock = threading.Lock()
ids = itertools.count(1)


def app(environ, start_response):
    request = Request(environ)
    rid = "werkzeug-%d" % next(ids)
    try:
        endpoint, _ = URLS.bind_to_environ(environ).match()
        status = 200
    except HTTPException as e:  # 405, or a redirect to the canonical path
        endpoint, status = "", e.code or 400
    key = request.headers.get("X-Api-Key")
    with lock:
        seen.append({"id": rid, "handler": endpoint, "method": request.method, "path": request.path,
                     "key": key or "", "hasKey": bool(key)})
    request.get_data()  # read the body, as a handler does
    resp = Response(endpoint + "\n", status=status)
    resp.headers["X-Diff-Id"] = rid
    return resp(environ, start_response)


def control(environ, start_response):
    request = Request(environ)
    start = int(request.args.get("from", "0"))
    with lock:
        body = json.dumps(seen[start:])
    return Response(body, content_type="application/json")(environ, start_response)


class Handler(WSGIRequestHandler):
    protocol_version = "HTTP/1.1"  # keep-alive, as behind a proxy

    def log_request(self, *args, **kwargs):
        pass


def main():
    srv = make_server("127.0.0.1", 0, app, threaded=True, request_handler=Handler)
    ctl = make_server("127.0.0.1", 0, control, threaded=True, request_handler=Handler)
    for s in (srv, ctl):
        threading.Thread(target=s.serve_forever, daemon=True).start()
    print("%d %d" % (srv.server_port, ctl.server_port), flush=True)
    threading.Event().wait()


if __name__ == "__main__":
    sys.exit(main())
