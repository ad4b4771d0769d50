"""How a request's output is constrained: the constraint backend and everything it owns.

* `backend` - the `ConstraintBackend` Protocol (a backend owns the whole turn: `admit`, then
  `turn(plan, engine)` as events; a client's own constraint: `client`) and what the grammar
  backends share;
* `guidance` (the default), `xgrammar`, `outlines` - the backends;
* `factory` - builds the configured backend, complete (the one place that names the classes);
* `turn` - the plan, the events, the one retry policy, the one-request turn;
* `walker` - the one schema walker and the one list of inexact keywords;
* `sandbox` - the one compile pool: worker processes with a deadline and a memory ceiling;
* `schemas` - the one verdict cache, and schemas as admitted;
* `schema_regex`, `regexes` - JSON Schema to regex and its automaton (outlines only).
"""
