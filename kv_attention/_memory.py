"""Memory: every constructor that allocates from its sizes checks them here first.

A size too large for the machine is a ValueError naming the bytes (``check_memory``),
not a MemoryError, and numpy's own refusal of a shape is a ValueError naming the sizes
(``named_allocation_failure``). Shared by the caches, the paged pool and the problems.
"""

import contextlib
import os


def check_memory(nbytes, what):
    """``nbytes``, the bytes ``what`` (text, e.g. "a pool of ...") needs; ValueError beyond physical memory.

    Every constructor that allocates from its sizes checks them here first, so that
    a size too large for the machine is a ValueError naming the bytes, not a MemoryError.
    """
    memory = physical_memory()
    if memory is not None and nbytes > memory:
        raise too_large_for_memory(nbytes, what, f"this machine has {memory} bytes")
    return nbytes


def physical_memory():
    """This machine's physical memory in bytes, or None where the OS does not say."""
    try:
        return os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (AttributeError, ValueError, OSError):
        return None


_NUMPY_SHAPE_REFUSALS = ("array is too big", "Maximum allowed dimension exceeded")  # numpy's ValueErrors for a shape


@contextlib.contextmanager
def named_allocation_failure(nbytes, what):
    """Context manager for the allocation of ``what`` (text naming the sizes), which :func:`check_memory` passed.

    A MemoryError in the block becomes the ValueError of :func:`too_large_for_memory`.
    numpy's own refusal of a shape (a size, or the product of the nonzero ones
    in bytes, beyond 2**63 - 1) becomes a ValueError naming ``what``: out of
    memory only if the arrays hold bytes (``StaticCache((0, 10**30), 4, 1, 1)`` holds 0).
    Any other error propagates as it is.
    """
    try:
        yield
    except MemoryError:
        raise too_large_for_memory(nbytes, what, "the allocation failed") from None
    except ValueError as error:
        if not str(error).startswith(_NUMPY_SHAPE_REFUSALS):
            raise
        if nbytes:
            raise too_large_for_memory(nbytes, what, f"numpy: {error}") from None
        raise ValueError(
            f"{what} holds 0 bytes, but numpy cannot make arrays of these sizes ({error}): every size, "
            "and the product of the nonzero ones in bytes, must be at most 2**63 - 1"
        ) from None


def too_large_for_memory(nbytes, what, why):
    """The ValueError for ``what`` (text), which needs ``nbytes`` bytes that memory cannot hold (``why``)."""
    return ValueError(f"{what} needs {nbytes} bytes ({nbytes / 2**30:.3g} GiB), more than memory can hold ({why})")
