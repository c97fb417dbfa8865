"""The asv machine name results are recorded under: the hostname plus a fingerprint of the hardware and host.

asv names a machine by its hostname alone, so two VMs both called ``vm``, with
the same CPU string but different speeds, would store their results as one
machine, and results copied between them would mix. :func:`default_name` is
``<hostname>-<fingerprint>``: 8 hex digits of the SHA-256 of the CPU model,
the CPU count, the architecture and the host's machine id (``/etc/machine-id``,
systemd's per-installation id; else D-Bus's copy; else the network card's
address from :func:`uuid.getnode`). The same host always gets the same name; a
clone of a VM image with a regenerated machine id, or the same disk on other
hardware, gets another.

The asv plugin (:mod:`tools.asv_plugin`) makes it asv's own default, so plain
``asv machine --yes`` and ``asv run`` use it too; ``--machine NAME`` overrides
it everywhere. Only the standard library is imported here, plus asv's
CPU description inside :func:`fingerprint` when asv is importable.
"""

import argparse
import hashlib
import multiprocessing
import re
import platform
import uuid

MACHINE_ID_FILES = ("/etc/machine-id", "/var/lib/dbus/machine-id")


def machine_id():
    """This host's machine id (32 hex digits on systemd hosts), or its MAC address where there is none."""
    for path in MACHINE_ID_FILES:
        try:
            with open(path) as f:
                text = f.read().strip()
        except OSError:
            continue
        if text:
            return text
    return f"mac-{uuid.getnode():012x}"


def cpu_description():
    """The CPU string asv records in machine.json (``model name`` of /proc/cpuinfo on Linux)."""
    try:
        from asv.util import get_cpu_info
    except ImportError:
        return platform.processor()
    try:
        return get_cpu_info() or platform.processor()
    except OSError:
        return platform.processor()


NAME = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]{0,99}")  # one folder name under asv's results directory


def check_name(name):
    """``name`` if it is one plain folder name (letters, digits, ``.``, ``_``, ``-``; no ``/``, no leading dot).

    asv stores a machine's results in ``<results_dir>/<name>/``, so ``../docs`` or
    ``a/b`` would write outside it. ValueError otherwise.
    """
    if not isinstance(name, str) or not NAME.fullmatch(name):
        raise ValueError(f"machine name must be letters, digits, '.', '_' or '-' (not starting with '.', "
                         f"at most 100 characters): it names a folder of the results, got {name!r}")
    return name


def name_argument(text):
    """argparse type of ``--machine``: :func:`check_name`."""
    try:
        return check_name(text)
    except ValueError as error:
        raise argparse.ArgumentTypeError(str(error)) from None


def chosen_argument(text):
    """argparse type of ``report``'s ``--machine``: the name of a machine to choose among those found.

    It is matched against each machine.json's name (asv's), never joined to a path, so any name asv could
    record is taken (``my laptop``), but not one with ``/`` or a control character, nor an empty one.
    """
    if not text or len(text) > 200 or "/" in text or any(ord(c) < 32 or ord(c) == 127 for c in text):
        raise argparse.ArgumentTypeError(f"machine name must be 1-200 characters, without '/' or control "
                                         f"characters: it is a machine.json's name, got {text!r}")
    return text


def fingerprint():
    """8 hex digits identifying this hardware and host: SHA-256 of CPU, CPU count, architecture, machine id."""
    text = "\n".join([cpu_description(), str(multiprocessing.cpu_count()), platform.machine(), machine_id()])
    return hashlib.sha256(text.encode()).hexdigest()[:8]


def default_name():
    """``<hostname>-<fingerprint>``, e.g. ``vm-3fa1c2d9``: the asv machine name of this host."""
    return f"{platform.node() or 'host'}-{fingerprint()}"
