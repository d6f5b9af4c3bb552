"""Stage 4, sharing (lessons 04-05): copy-on-write and fork, sequences, sampling and beams,
prefix caching. Read in this order: ``cow.py``, ``sequence.py``, ``sampling.py``,
``prefix_cache.py``. Then stage 5, ``serving/``.

``minipaged.sharing`` was a single module before 0.2 (now ``sharing/sampling.py``); its names
are re-exported here, on first use.
"""


def __getattr__(name: str):
    import importlib

    sampling = importlib.import_module("minipaged.sharing.sampling")

    try:
        return getattr(sampling, name)
    except AttributeError:
        raise AttributeError(f"module 'minipaged.sharing' has no attribute {name!r}") from None
