"""The catalog: the YAML an operator writes, read into api/catalog.py's typed entry.

``bounds`` (every ``MAX_*`` and the bounded YAML reader), ``spec`` (durations), ``names``
(aliases and fallbacks), ``scale`` (replica ranges and autoscale settings) and ``parse``
(the entry, with every problem named at once). Import the module you need: this package
imports nothing, so api/catalog.py may use its bounds without a circle.
"""
