"""The `loopstack` command: `serve` and `prepare-model` here; `memory`, `agent` and `bench` are
sub-apps mounted from their packages (`loopstack.memory.cli`, `loopstack.agent.cli`,
`loopstack.bench.cli`)."""

from __future__ import annotations

import importlib
import logging

import typer

app = typer.Typer(help="loopstack: tool-using agents on your own open-weight model.")
logger = logging.getLogger(__name__)


@app.command()
def serve(
    host: str | None = typer.Option(None, help="Bind address (LOOPSTACK_HOST)."),
    port: int | None = typer.Option(None, help="Port (LOOPSTACK_PORT, default 8000)."),
    model: str | None = typer.Option(
        None, help="HF id, local HF folder, .gguf file, or unset for the offline default."
    ),
) -> None:
    """Serve the model behind an OpenAI-compatible API."""
    from loopstack.serving.config import ServerSettings
    from loopstack.serving.server import serve as run

    settings = ServerSettings()
    overrides = {k: v for k, v in {"host": host, "port": port, "model": model}.items() if v}
    run(settings.model_copy(update=overrides))


@app.command("prepare-model")
def prepare_model(model: str | None = typer.Option(None)) -> None:
    """Resolve (and convert, once) the model without serving it."""
    from loopstack.serving.config import ServerSettings
    from loopstack.serving.engine.hardware import default_model, detect_hardware
    from loopstack.serving.engine.model_store import resolve_model

    settings = ServerSettings()
    if model:
        settings = settings.model_copy(update={"model": model})
    hw = detect_hardware(settings.device)
    resolved = resolve_model(settings.model, settings.home, default_for_device=default_model(hw))
    typer.echo(resolved.path_or_id)


def _mount(module: str, name: str) -> None:
    """Add `module`'s Typer app as sub-command `name`.

    Only that sub-package itself being absent is a reason to leave the command out. Any other
    import error (a missing dependency, a typo, no `app`) is a bug: it is logged, and the
    sub-command is replaced by one that raises it, so `loopstack NAME ...` shows the real
    traceback while the other commands (`serve`) keep working."""
    try:
        sub = importlib.import_module(module).app
    except ModuleNotFoundError as exc:
        if exc.name in {module, module.partition(".")[0]}:
            logger.debug("sub-command %s not available: %s", name, exc)
            return
        _mount_broken(name, exc)
    except (ImportError, AttributeError) as exc:
        _mount_broken(name, exc)
    else:
        app.add_typer(sub, name=name)


def _mount_broken(name: str, error: Exception) -> None:
    logger.warning("sub-command %r failed to import: %r", name, error)
    settings = {"allow_extra_args": True, "ignore_unknown_options": True}

    @app.command(name, context_settings=settings, add_help_option=False)
    def broken() -> None:
        raise error


_mount("loopstack.memory.cli", "memory")
_mount("loopstack.agent.cli", "agent")
_mount("loopstack.bench.cli", "bench")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
