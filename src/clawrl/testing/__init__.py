"""Test tools that ship with clawrl for its tests, benchmarks and scripts (and for users who test
their own setup): a throwaway PostgreSQL server (:mod:`.postgres`), recorded harness traffic and
its replay (:mod:`.traffic`), scripted harness replies (:mod:`.replies`).

Production code never imports this package (``tests/test_layers.py``).
"""
