"""Signal notes: a rank tells its launcher (``python -m iris.run``) which signal it got.

A rank stopped by SIGINT or SIGTERM shuts its interpreter down before it dies by the
signal, closing its connections on the way; its peers' collectives then fail and they
exit with a status, often before it ends. With the note, written by the rank's signal
handler as the signal arrives, the launcher names the rank that got the signal however
long its shutdown takes. The launcher makes the directory (private, ``mkdtemp``) and
hands it to its ranks in ``IRIS_RUN_SIGNAL_NOTES``.
"""

from __future__ import annotations

import os

#: The launcher's private directory (``python -m iris.run``) where a rank notes a signal it got.
SIGNAL_NOTES = "IRIS_RUN_SIGNAL_NOTES"


def note_signal(signum: int) -> None:
    """Tell this rank's launcher that it got signal ``signum`` (its handler calls this first).

    Nothing happens outside a launcher of this package; a note that exists already is
    kept (``O_EXCL``, which also refuses a link put in its place).

    Example:
        >>> note_signal(signal.SIGINT)   # in a rank of python -m iris.run
    """
    directory, rank = os.environ.get(SIGNAL_NOTES), os.environ.get("RANK", "")
    if not directory or not rank.isdigit():
        return
    try:
        path = os.path.join(directory, f"rank{int(rank)}")
        descriptor = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    except OSError:
        return
    with os.fdopen(descriptor, "w") as note:
        note.write(str(int(signum)))


def noted_signals(directory: str) -> dict[int, int]:
    """The signals ranks noted in ``directory`` (:func:`note_signal`): rank -> signal number.

    Example:
        >>> noted_signals(notes)
        {1: 2}
    """
    noted = {}
    for name in os.listdir(directory):
        try:
            with open(os.path.join(directory, name)) as note:
                noted[int(name.removeprefix("rank"))] = int(note.read())
        except (OSError, ValueError):
            continue  # being written, or not a note
    return noted
