"""Runs ``trainmedic`` with torch and numpy unimportable (a supervisor without them).

Usage: ``python without_torch.py walk`` imports every module the supervisor, doctor
and the reports may load and prints those that failed; ``python without_torch.py
ARGS...`` runs ``trainmedic ARGS...``. Either way the job launched by ``run`` is a
separate interpreter, not affected by the block.
"""

import importlib
import pkgutil
import sys

BLOCKED = ("torch", "numpy")
# Modules that run inside the job or the demo's training script, with the job's torch.
NEEDS_TORCH = (
    "trainmedic.__main__",  # runs the command line when imported
    "trainmedic.demo.digits",
    "trainmedic.demo.train_faulty",
    "trainmedic.demo.train_lenet",
    "trainmedic.integrations.",
)


class Block:
    def find_spec(self, name, path=None, target=None):
        if name.split(".")[0] in BLOCKED:
            raise ImportError(f"No module named {name!r} (blocked)")
        return None


def walk():
    import trainmedic

    failed = []
    for info in pkgutil.walk_packages(trainmedic.__path__, "trainmedic."):
        if info.name.startswith(NEEDS_TORCH):
            continue
        try:
            importlib.import_module(info.name)
        except BaseException as exc:
            failed.append(f"{info.name}: {type(exc).__name__}: {exc}")
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in BLOCKED)
    print("\n".join(failed + [f"loaded {m}" for m in loaded]))
    return 1 if failed or loaded else 0


if __name__ == "__main__":
    sys.meta_path.insert(0, Block())
    if sys.argv[1:] == ["walk"]:
        sys.exit(walk())
    from trainmedic.cli.main import main

    sys.exit(main(sys.argv[1:]))
