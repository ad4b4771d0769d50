"""Golden tools: a small file workspace ($GOLDEN_WORKDIR/workspace), paths relative to it."""

from __future__ import annotations

from loopstack.bench.golden import data as _data


def list_files() -> list[str]:
    """List every file in the workspace (paths relative to the workspace root)."""
    root = _data.workspace()
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def read_file(path: str) -> str:
    """Read a text file from the workspace.

    Args:
        path: Path relative to the workspace root, for example notes/todo.txt.
    """
    return _data.inside_workspace(path).read_text()


def write_file(path: str, content: str) -> str:
    """Create or overwrite a text file in the workspace.

    Args:
        path: Path relative to the workspace root.
        content: The full text to write.
    """
    target = _data.inside_workspace(path)
    target.parent.mkdir(parents=True, exist_ok=True)
    target.write_text(content)
    _data.record_action("write_file", path=path, content=content)
    return f"wrote {len(content)} characters to {path}"
