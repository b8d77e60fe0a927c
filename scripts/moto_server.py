"""moto's server (the local AWS emulator the tests start), with each DynamoDB request
served whole before the next one starts.

Why: moto's threaded server runs concurrent DynamoDB requests side by side without
isolating them, so two TransactWriteItems can both pass a condition only one of them
may pass. A hostile test saw it, and the store's conformance suite then failed: two
deletes of one endpoint both committed, and both took it off the tenant's endpoint
count. DynamoDB itself makes each request atomic and isolates each transaction from
every other; one lock around the DynamoDB requests gives moto the same. The other
services stay concurrent: an SQS long poll must not hold up the rest.

Usage: python scripts/moto_server.py [-H HOST] -p PORT (the flags of moto.server).
"""

import argparse
import signal
import sys
import threading

from moto.moto_server.werkzeug_app import (
    DomainDispatcherApplication,
    create_backend_app,
)
from werkzeug.serving import run_simple

try:
    from moto.moto_server.werkzeug_app import MotoRequestHandler
except ImportError:
    # Before moto 5.2.5: werkzeug's own handler. Moto's keeps S3 metadata headers
    # spelled with underscores, which Entrega never sends.
    MotoRequestHandler = None

# DynamoDB and DynamoDB Streams requests name their operation in this header.
TARGET_HEADER = "HTTP_X_AMZ_TARGET"
DYNAMODB_TARGET = "DynamoDB"


def serialising_dynamodb(app):
    lock = threading.Lock()

    def serve(environ, start_response):
        if environ.get(TARGET_HEADER, "").startswith(DYNAMODB_TARGET):
            with lock:
                # The whole answer is made under the lock, not only its start.
                return list(app(environ, start_response))
        return app(environ, start_response)

    return serve


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("-H", "--host", default="127.0.0.1")
    parser.add_argument("-p", "--port", type=int, required=True)
    args = parser.parse_args()
    signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
    app = DomainDispatcherApplication(create_backend_app)
    run_simple(
        args.host,
        args.port,
        serialising_dynamodb(app),
        threaded=True,
        request_handler=MotoRequestHandler,
    )


if __name__ == "__main__":
    main()
