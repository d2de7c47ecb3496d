"""The output folder: which files the generator owns, and replacing them safely.

Each spec's files are listed in a manifest, `<out>/.codegen/<package>.files`. The generator
only ever overwrites or deletes files listed there (or byte-identical to what it would write),
so pointing --out at a folder that holds other files never loses them. New files are rendered
completely before anything is written, then moved into place one by one (os.replace), and the
manifest is written last: a failed render leaves the previous output as it was.
"""

from __future__ import annotations

import difflib
import os
import tempfile
from pathlib import Path

MANIFEST_DIR = ".codegen"


class OwnershipError(Exception):
    """The generator would overwrite a file it did not write."""


class Output:
    def __init__(self, root: Path):
        self.root = root

    def _manifest(self, package: str) -> Path:
        return self.root / MANIFEST_DIR / f"{package}.files"

    def owned(self, package: str) -> list[str]:
        path = self._manifest(package)
        if not path.exists():
            return []
        return [line for line in path.read_text().splitlines() if line]

    def replace(self, package: str, files: dict[str, bytes]) -> None:
        old = set(self.owned(package))
        for rel, data in files.items():
            dest = self.root / rel
            if dest.exists() and rel not in old and dest.read_bytes() != data:
                raise OwnershipError(
                    f"{dest} exists and was not written by the generator; move it away or "
                    f"choose another --out (nothing was changed)"
                )
        self.root.mkdir(parents=True, exist_ok=True)
        with tempfile.TemporaryDirectory(dir=self.root, prefix=".codegen-tmp-") as tmp:
            staged = []
            for rel, data in files.items():
                dest = self.root / rel
                if dest.exists() and dest.read_bytes() == data:
                    continue
                src = Path(tmp) / rel
                src.parent.mkdir(parents=True, exist_ok=True)
                src.write_bytes(data)
                staged.append((src, dest))
            for src, dest in staged:
                dest.parent.mkdir(parents=True, exist_ok=True)
                os.replace(src, dest)
        for rel in sorted(old - set(files)):
            stale = self.root / rel
            if stale.exists():
                stale.unlink()
            _prune_empty(stale.parent, self.root)
        manifest = self._manifest(package)
        manifest.parent.mkdir(parents=True, exist_ok=True)
        listing = "".join(f"{rel}\n" for rel in sorted(files))
        if not manifest.exists() or manifest.read_text() != listing:  # make watches its mtime
            manifest.write_text(listing)

    def diff(self, package: str, files: dict[str, bytes], stream) -> bool:
        """Print how the committed output differs from `files`; True when it does."""
        drift = False
        owned = set(self.owned(package))
        if owned != set(files):
            drift = True
            stream.write(f"{self._manifest(package)} does not list exactly the rendered files\n")
        for rel in sorted(set(files) | owned):
            new_b = files.get(rel)
            dest = self.root / rel
            old_b = dest.read_bytes() if dest.exists() else None
            if new_b == old_b:
                continue
            drift = True
            if new_b is None:
                stream.write(f"stale file (not generated any more): {dest}\n")
                continue
            try:
                a = (old_b or b"").decode("utf-8").splitlines(keepends=True)
                b = new_b.decode("utf-8").splitlines(keepends=True)
            except UnicodeDecodeError:
                stream.write(f"binary file differs: {dest}\n")
                continue
            stream.writelines(
                difflib.unified_diff(a, b, f"{dest} (committed)", f"{dest} (from spec)", n=2)
            )
        return drift


def _prune_empty(folder: Path, root: Path) -> None:
    while folder != root and folder.is_dir() and not any(folder.iterdir()):
        folder.rmdir()
        folder = folder.parent
