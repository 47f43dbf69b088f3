"""``saga serve``: the HTTP API, live event streams and the web run viewer, in one process.

- :mod:`~saga.server.app` builds the ASGI app: authentication, body limits, errors as
  HTTP answers, the viewer's pages, and a worker thread that drives submitted runs;
- :mod:`~saga.server.runs` is saga's own resource API under ``/api/v1``;
- :mod:`~saga.server.compositions` is the seeds' API (seed 000's ``/api/composition``
  and seed 001's ``/api/v1/compositions``), translated onto the same runs;
- :mod:`~saga.server.streams` follows the log: Server-Sent Events per run and for the
  whole store, and seed 002's WebSocket events.

Everything goes through :class:`saga.api.Saga` over the configured store, so the CLI,
workers and the service always agree. Needs the ``serve`` extra
(``pip install 'saga[serve]'``).
"""
