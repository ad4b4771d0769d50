"""The `loopstack` command: `serve` now; `memory` (and later `agent`, `bench`) as sub-apps."""

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
    from serving.config import ServerSettings
    from serving.server import serve as run

    settings = ServerSettings()
    overrides = {k: v for k, v in {"host": host, "port": port, "model": model}.items() if v}
    run(settings.model_copy(update=overrides))


@app.command("prepare-model")
def prepare_model(model: str | None = typer.Option(None)) -> None:
    """Resolve (and convert, once) the model without serving it."""
    from serving.config import ServerSettings
    from serving.hardware import default_model, detect_hardware
    from serving.model_store import resolve_model

    settings = ServerSettings()
    if model:
        settings = settings.model_copy(update={"model": model})
    hw = detect_hardware(settings.device)
    resolved = resolve_model(settings.model, settings.home, default_for_device=default_model(hw))
    typer.echo(resolved.path_or_id)


def _mount(module: str, name: str) -> None:
    """Add `module`'s Typer app as sub-command `name`, or skip it when that part of the stack
    is absent. Only the sub-package's own module missing is a reason to skip: any other import
    error inside it (a missing dependency, a typo) is a bug and is raised, not hidden."""
    try:
        sub = importlib.import_module(module).app
    except ModuleNotFoundError as exc:
        package = module.partition(".")[0]
        if exc.name not in {module, package}:
            raise
        logger.debug("sub-command %s not available: %s", name, exc)
        return
    app.add_typer(sub, name=name)


_mount("memory.cli", "memory")
_mount("agent.cli", "agent")
_mount("bench.cli", "bench")


def main() -> None:
    app()


if __name__ == "__main__":
    main()
