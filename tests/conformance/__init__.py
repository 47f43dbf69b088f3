"""saga's conformance simulator (issue 38, "every path holds").

- :mod:`.model`: the case generator (Hypothesis) and the oracle, apart from the scheduler;
- :mod:`.tools`: the tools workers load with ``--tools``, each call and undo one ledger line;
- :mod:`.harness`: real ``saga worker`` processes driven under the case's operations;
- :mod:`.invariants`: what is checked, and what each invariant means;
- :mod:`.revisions_ops`, :mod:`.revisions_check`: migrate, reset and label as operations,
  and what is checked after them (issue 40);
- :mod:`.runner`: budgets, stores, one case end to end, the replay of a saved case;
- :mod:`.test_conformance`: the CI budget (``pytest tests/conformance``) and the long mode
  (``bash ops/conformance.sh --minutes 30``).
"""
