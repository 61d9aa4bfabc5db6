"""The core of the controller, in one room: each allocation's owner and everything it decides with.

- `owner`: one allocation's owner, composed of parts that are objects of their own: the turn
  engine of `turns` (the inbox, whose turn it is, running operations a step at a time,
  committing a turn's writes together, publishing), `steps` (the writes and agent calls
  operations are made of), `queueing` (the waiting requests and the pass over them) and
  `decisions` (what each command does);
- `owners`: every allocation's owner, and the little they share (partition ids, the queues' bounds);
  an owner knows it only as `turns.Registry`, what it asks of it;
- `commands`: what an owner is asked, and how the asker waits for the answer;
- `operations`: the operations on a partition (create, reset, remove, relocate, finish, grant), step by
  step, which know their owner only as `operations.Owner`, what they ask of it; and `effects`, the
  steps they take (a store write, agent calls);
- `state`: an allocation as its owner holds it; `snapshot`: what readers see of it;
- `placing`: where a partition goes; `agents`: how agent calls are made outside the owner's turn;
- `lending`: free machines lent to an idle-time test, which a partition that needs one takes back;
- `changes`: the change feed that live views watch.

Use cases (`vipu.controller.usecases`) and the health pass (`vipu.controller.loops`) ask owners
through commands and read their snapshots; nothing else holds a partition's state.

Held, kept out, configured, lease, loan, operation, down and draining mean one thing each here, as
the README's "How it is built" says.
"""
