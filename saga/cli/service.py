"""``saga serve`` (the HTTP API, event streams and viewer) and ``saga watch`` (the same
events, followed in the terminal)."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import click

from saga.cli.app import _saga, main, note, tools_option
from saga.cli.render import _clock, _event_detail
from saga.config import load_settings
from saga.errors import ConfigError
from saga.telemetry import logs
from saga.views import LogReader, run_events_after


@main.command()
@click.option("--host", default="127.0.0.1", show_default=True,
              help="Address to listen on (beyond loopback, SAGA_API_TOKEN is required; "
                   "without it, a token is made and a sign-in URL printed).")
@click.option("--port", type=click.IntRange(0, 65535), default=8080, show_default=True)
@click.option("--no-worker", is_flag=True,
              help="Do not drive runs here: other `saga worker` processes do.")
@click.option("--concurrency", type=click.IntRange(1, 256), default=4, show_default=True,
              help="Runs the built-in worker drives at once.")
@tools_option
def serve(host: str, port: int, no_worker: bool, concurrency: int,
          tools: tuple[str, ...]) -> None:
    """Serve the HTTP API, live event streams and the web run viewer.

    \b
    Example:
      saga serve --port 8080            # then open http://127.0.0.1:8080/
      SAGA_API_TOKEN=s3cret saga serve --host 0.0.0.0
    """
    try:
        import uvicorn

        from saga.server.app import create_app
        from saga.server.browser import generate_token
        from saga.server.service import Tokens, check_bind
        from saga.server.timeouts import MAX_HEADER_BYTES, HeaderDeadline
    except ImportError as e:
        raise ConfigError(f"saga serve needs the serve extra ({e.name} is missing): "
                          "pip install 'saga[serve]'") from None
    settings = load_settings()
    tokens = Tokens.from_env()
    check_bind(host, tokens)
    sign_in = None
    if not tokens.required:
        # no token is no reason to let any web page or local user drive the runs: make
        # one, keep it for this user only, and sign the operator's browser in with it
        token, kept = generate_token(settings.home)
        tokens = Tokens(write=token, name=tokens.name)
        shown = f"[{host}]" if ":" in host else host
        sign_in = f"http://{shown}:{port}/?token={token}"
    app = create_app(settings, tools=tools, worker=not no_worker, concurrency=concurrency,
                     tokens=tokens, hosts=(host,))
    note(f"saga serving http://{host}:{port}/ on {settings.store_description}"
         f"{'' if no_worker else f' with a worker ({concurrency} at once)'}")
    if sign_in is not None:
        note(f"sign in (once per browser): {sign_in}\n"
             f"the API token is in {kept} (send it as Authorization: Bearer ...)")
    # With --log-format, uvicorn's lines go through saga's handler too (JSON or text).
    extra: dict[str, Any] = {"log_config": None} if logs.configured() else {}
    uvicorn.run(app, host=host, port=port, log_level="warning", http=HeaderDeadline,
                timeout_keep_alive=5, h11_max_incomplete_event_size=MAX_HEADER_BYTES,
                **extra)


@main.command()
@click.argument("run_id", required=False)
@click.option("--after", type=click.IntRange(min=0), default=0,
              help="Start after this id (a version for a RUN, else a log position): "
                   "the first column of an earlier watch, to go on where it stopped.")
@click.option("--follow/--no-follow", default=True, show_default=True,
              help="Keep following (a RUN's watch ends with the run).")
@click.option("--poll", type=click.FloatRange(0.05, 60), default=0.25, show_default=True,
              help="Seconds between looks at the store.")
@click.option("--json", "as_json", is_flag=True, help="Print one JSON event per line.")
def watch(run_id: str | None, after: int, follow: bool, poll: float, as_json: bool) -> None:
    """Follow events as they are recorded: one RUN's, or every run's.

    \b
    Example:
      saga watch ORDER-42              # until the run ends
      saga watch --after 1200          # every run, from log position 1200 on
    """
    saga = _saga()
    app = saga.app
    if run_id is not None:
        run_key = saga.resolve(run_id)
        position = after
        while True:
            events, ended = run_events_after(app, run_key, position)
            for event in events:
                _show(event["version"], run_key, event, as_json)
                position = event["version"]
            if ended or (not follow and not events):
                return
            if not events:
                time.sleep(poll)
    reader = LogReader(app)
    position = after
    while True:
        events = reader.after(position)
        for event in events:
            _show(event["position"], event["run_id"], event, as_json)
            position = event["position"]
        if not events:
            if not follow:
                return
            time.sleep(poll)


def _show(ident: int, run_id: str, event: dict[str, object], as_json: bool) -> None:
    if as_json:
        click.echo(json.dumps({"id": ident, "run_id": run_id, **event}, default=str,
                              ensure_ascii=False))
        return
    click.echo(f"{ident:>6} {_clock(str(event['timestamp']))} {run_id} {event['type']:<18} "
               f"{_event_detail(event)}")


@main.command(name="mcp")
@click.option("--http", "http", metavar="HOST:PORT",
              help="Serve streamable HTTP at http://HOST:PORT/mcp instead of stdio (with "
                   "saga serve's token rules: beyond loopback, SAGA_API_TOKEN is required).")
@click.option("--compositions", "compositions", multiple=True,
              type=click.Path(exists=True, file_okay=False),
              help="A folder whose compositions (and SKILL.md) become tools; repeatable "
                   "(default: the configured templates path).")
@click.option("--wait", type=click.FloatRange(0, 3600), default=30, show_default=True,
              help="Seconds a call waits for its run to end before answering with its id.")
@click.option("--allow-approve", is_flag=True,
              help="Offer saga_approve (approvals are otherwise left to people).")
@tools_option
def mcp(http: str | None, compositions: tuple[str, ...], wait: float, allow_approve: bool,
        tools: tuple[str, ...]) -> None:
    """Serve saga as an MCP server: each composition a tool, plus skill_run and saga_*.

    \b
    Example:
      saga mcp                                   # over stdio, for an MCP client
      saga mcp --http 127.0.0.1:8765 --wait 60   # streamable HTTP at /mcp
    """
    try:
        import anyio

        from saga.server import mcp_server
    except ImportError as e:
        raise ConfigError(f"saga mcp needs the mcp extra ({e.name} is missing): "
                          "pip install 'saga[mcp]'") from None
    saga = _saga(tools)
    dirs = [Path(d) for d in compositions] or mcp_server.default_dirs(saga)
    viewer = mcp_server.viewer_url(saga.settings.file, os.environ)
    logic = mcp_server.SagaMCP(saga, dirs, wait=wait, allow_approve=allow_approve,
                               viewer=viewer)
    if http is None:
        anyio.run(mcp_server.serve_stdio, mcp_server.build_server(logic))
        return
    host, sep, port = http.rpartition(":")
    if not sep or not port.isdigit():
        raise ConfigError(f"--http {http!r}: give HOST:PORT (127.0.0.1:8765)")
    host = host.strip("[]")
    try:
        import uvicorn

        from saga.server.service import Tokens, check_bind
    except ImportError as e:
        raise ConfigError(f"saga mcp --http needs the serve extra ({e.name} is missing): "
                          "pip install 'saga[serve]'") from None
    tokens = Tokens.from_env()
    check_bind(host, tokens)
    server = mcp_server.build_server(logic, mcp_server.token_writes(tokens))
    note(f"saga MCP server at http://{http}/mcp on {saga.settings.store_description}")
    extra: dict[str, Any] = {"log_config": None} if logs.configured() else {}
    uvicorn.run(mcp_server.http_app(server, host, tokens), host=host, port=int(port),
                log_level="warning", **extra)
