"""`headscope serve`: the live explorer, a local web app over the JSON API (`headscope.serve`)."""

from __future__ import annotations

import ipaddress

import click

from ..common import attention_options, device_options, fail, load_or_fail, models_or_fail, quiet_option, say


def _loopback(host: str) -> bool:
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


@click.command()
@click.option("--model", "models", multiple=True, default=("minilm",), show_default=True,
              help="Packaged name, folder or hub id; repeat (or separate with commas) to serve several models.")
@click.option("--host", default="127.0.0.1", show_default=True, help="Address to listen on (loopback by default).")
@click.option("--port", type=click.IntRange(0, 65535), default=8765, show_default=True)
@click.option("--allow-remote", is_flag=True,
              help="Allow a --host other than loopback: anyone who reaches it can run the models on your texts.")
@quiet_option
@attention_options
@device_options
def cli(models, host, port, allow_remote, quiet, attention, memory_budget, device, dtype) -> None:
    """Open the live explorer at http://HOST:PORT/: type a text, see any head's attention, zoom into long
    texts, click a cell for its explain terms, step through a generation. Ctrl-C stops it."""
    names = [n.strip() for item in models for n in item.split(",") if n.strip()]
    if not names:
        fail("--model: give at least one model name")
    if len(set(names)) != len(names):
        fail("--model: a model is named twice")
    if not _loopback(host):
        if not allow_remote:
            fail(f"--host {host} is not a loopback address: the explorer runs models for anyone who reaches it; "
                 "add --allow-remote to serve it anyway")
        click.echo(f"headscope: warning: serving on {host}:{port} — anyone who can reach it can run the models",
                   err=True)
    models_or_fail(names)
    from headscope.serve import serve
    from headscope.workflows.explore import Explorer

    loaded = {}
    for name in names:
        say(f"loading {name} …", quiet=quiet)
        loaded[name] = load_or_fail(name, device, dtype)
    try:
        explorer = Explorer(loaded, attention=attention, budget=memory_budget)
    except ValueError as exc:
        fail(str(exc))
    shown = f"[{host}]" if ":" in host else host
    click.echo(f"headscope explorer: http://{shown}:{port}/ (Ctrl-C stops it)", err=True)
    server = serve(explorer, host=host, port=port)
    if not server.started:
        fail(f"could not listen on {host}:{port} (in use, or not an address of this machine); pick another --port",
             code=1)
