"""An engine's files resolved at once: the model on the calling thread, and the projector, the
draft model and the LoRA adapters each on a native thread beside it, so that a ``gs://``
projector or draft downloads while the model does rather than after it (issue 52).

What each resolver gives (a local path, downloaded and verified when it is remote), the errors
it raises and their messages are the resolver's own (app.model.source); what is decided here is
the order they are reported in, which is the order they used to run in: the model's error
first, then the projector's, the draft model's, the adapters'. Each file a resolver makes ready
is held (app.engine.file_holds) from that moment: a resolver beside the model holds its files
in a FileHolds of its own, handed to the engine's once it is waited for, and let go when it
ends if nobody waits for it any more (the model failed before it).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from app.base.state import LoadState
from app.base.threads import allocate_lock, start_native_thread
from app.engine.file_holds import FileHolds, collecting
from app.engine.lora import AdapterFile

Resolved = tuple[str, str | None, str | None, list[AdapterFile]]


class _Beside:
    """One resolver running on a native thread of its own."""

    def __init__(self, fn: Callable[[LoadState], Any], state: LoadState) -> None:
        self._fn = fn
        self._state = state
        self._holds = FileHolds()
        self._lock = allocate_lock()
        self._finished = allocate_lock()
        self._finished.acquire()  # released once, when the resolver has returned or raised
        self._out: tuple[bool, Any] | None = None
        self._abandoned = False
        start_native_thread(self._run)

    def _run(self) -> None:
        try:
            with collecting(self._holds):
                out: tuple[bool, Any] = (True, self._fn(self._state))
        except BaseException as exc:  # noqa: BLE001 - raised on the waiting thread
            out = (False, exc)
        with self._lock:
            self._out = out
            drop = self._abandoned
        if drop:
            self._holds.release()
        self._finished.release()

    def result(self, holds: FileHolds) -> Any:
        """Wait for the resolver (as long as its download's retries last); its files go to
        ``holds``; its exception is raised here."""
        self._finished.acquire()
        self._finished.release()
        assert self._out is not None
        holds.take(self._holds)
        ok, value = self._out
        if not ok:
            raise value
        return value

    def abandon(self) -> None:
        """Nobody will wait for it: its files are let go when it ends (now, if it has)."""
        with self._lock:
            self._abandoned = True
            ended = self._out is not None
        if ended:
            self._holds.release()


def resolve_files(
    state: LoadState,
    holds: FileHolds,
    model: Callable[[LoadState], str],
    projector: Callable[[LoadState], str | None],
    draft: Callable[[LoadState], str | None],
    adapters: Callable[[LoadState], list[AdapterFile]],
) -> Resolved:
    """The model's path, the projector's, the draft model's and the adapters, resolved at once,
    each file held in ``holds`` (released by the engine when it stops); the first failure in
    that order raised once the model and those before it have answered."""
    with collecting(holds):
        beside = [_Beside(fn, state) for fn in (projector, draft, adapters)]
        try:
            path = model(state)
            mmproj, draft_path, files = (b.result(holds) for b in beside)
        except BaseException:
            for b in beside:
                b.abandon()
            raise
    return path, mmproj, draft_path, list(files)
