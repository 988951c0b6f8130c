"""`headscope serve`: the live explorer, a local web app over the JSON API (`headscope.serve`)."""

from __future__ import annotations

import click

from ..common import internals as hs_
from ..common.exits import fail
from ..common.loading import load_or_fail, models_or_fail
from ..common.outputs import say
from ..common.options import options


@click.command()
@options("models")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (loopback by default).")
@click.option("--port", type=click.IntRange(0, 65535), default=8765, show_default=True)
@click.option("--allow-remote", is_flag=True,
              help="Allow a --host other than loopback; every request then needs the random token printed at start "
                   "(open the printed address once: it sets a cookie).")
@click.option("--allow-host", "allow_hosts", multiple=True, metavar="NAME",
              help="Also answer requests whose Host is NAME (a reverse proxy's name, say); repeat for several. "
                   "Loopback names and the --host address are always answered, any other name gets 403.")
@click.option("--max-in-flight", type=click.IntRange(1, 1000), default=8, show_default=True,
              help="Requests one client may have in flight at once; more get 429.")
@options("image", "quiet", "attention", "device")
def cli(models, host, port, allow_remote, allow_hosts, max_in_flight, images, quiet, attention, memory_budget, placement) -> None:
    """Open the live explorer at http://HOST:PORT/: type a text, see any head's attention, zoom into long
    texts, click a cell for its explain terms, step through a generation. Ctrl-C stops it.

    --image FILE (repeatable): pictures a vision–language decoder reads with a text; a request picks them by
    index and never names a file.

    It answers only its own page: requests with another Host or Origin get 403, POST bodies other than
    JSON 415, so a web page you visit cannot use it."""
    names = [n.strip() for item in models for n in item.split(",") if n.strip()]
    if not names:
        fail("--model: give at least one model name")
    if len(set(names)) != len(names):
        fail("--model: a model is named twice")
    from headscope.guard import Guard, host_name, loopback, new_token

    for name in allow_hosts:
        if not name.strip() or any(c in name for c in "/ @?#"):
            fail(f"--allow-host {name!r}: give a host name or address, such as explorer.lab.example")
    if not host.strip() or any(c.isspace() or c in "/@?#" for c in host):
        fail(f"--host {host!r}: give an address of this machine (127.0.0.1 by default, 0.0.0.0 for all) or its name")
    if not loopback(host_name(host)):
        if not allow_remote:
            fail(f"--host {host} is not a loopback address: the explorer runs models for anyone who reaches it; "
                 "add --allow-remote to serve it anyway")
        click.echo(f"headscope: warning: serving on {host}:{port} — anyone who can reach it and has the token can "
                   "run the models", err=True)
    guard = Guard(bound=host, allow_hosts=frozenset(allow_hosts), token=new_token() if allow_remote else None,
                  max_in_flight=max_in_flight)
    models_or_fail(names)
    _served_or_fail(names, images)
    from headscope.serve import listen, serve

    try:  # the port is taken now, before any model loads, and held until the server answers on it
        sock = listen(host, port)
    except OSError as exc:
        import errno

        if exc.errno == errno.EADDRINUSE:
            fail(f"--port {port}: {host}:{port} is in use (another server listens there); pick another --port "
                 "(0: any free port)")
        if exc.errno == errno.EACCES:
            fail(f"--port {port}: no permission to listen on {host}:{port} (ports below 1024 need privileges); "
                 "pick a port above 1023")
        fail(f"--host {host}: cannot listen on {host}:{port} ({exc.strerror or exc}); give an address of this "
             "machine (127.0.0.1 by default)")
    with sock:
        loaded = {}
        for name in names:
            say(f"loading {name} …", quiet=quiet)
            loaded[name] = load_or_fail(name, placement)
        try:
            # --image: read once here; the page picks them by index, and no request can name another file
            explorer = hs_.Explorer(loaded, attention=attention, budget=memory_budget, images=list(images))
        except ValueError as exc:
            fail(str(exc))
        if host in ("0.0.0.0", "::"):  # every address of this machine: a browser opens it by this machine's name
            import socket

            shown = socket.gethostname()
        else:
            shown = f"[{host}]" if ":" in host else host
        token = f"?token={guard.token}" if guard.token else ""
        bound = sock.getsockname()[1]  # --port 0: the free port the system gave
        click.echo(f"headscope explorer: http://{shown}:{bound}/{token} (Ctrl-C stops it)", err=True)
        server = serve(explorer, host=host, port=bound, guard=guard, sock=sock)
    if not server.started:
        fail(f"could not serve on {host}:{bound}; pick another --port", code=1)
    if server.stopped_by:
        click.echo(f"headscope explorer: stopped by {server.stopped_by}; every request in flight was answered", err=True)


def _served_or_fail(names: list[str], images) -> None:
    """Before any model loads: each model one the explorer can serve, its type read without loading it
    (`probe.loading.model_type_of`), and --image only where a served model reads images; the images readable."""
    types = {name: hs_.model_type_of(name) for name in names}
    for name, model_type in types.items():
        why = hs_.unserved(name, model_type)
        if why is not None:
            fail(f"--model {why}")
    if images:
        if not any(hs_.reads_images(t) is not False for t in types.values()):
            fail(hs_.no_image_reader(names))
        for k, path in enumerate(images):
            try:
                hs_.load_image(k, path)
            except (OSError, ValueError, TypeError) as exc:
                fail(str(exc))
