"""The `minibroker` command line (entry point `client.cli:main`).

    minibroker dev                      a local cluster in the foreground
    minibroker dev status|kill|stop|restart [NODE]   control it from another shell
    minibroker controller|broker ARGS   run a server (`python -m controller|broker ARGS`)
    minibroker topic create|list|describe|delete
    minibroker group list|describe|reset-offsets|delete
    minibroker produce TOPIC            stdin lines -> records
    minibroker consume TOPIC            records -> stdout
    minibroker cluster                  brokers and controller
    minibroker cluster health           healthy or not, and why (exit code 1 when not)
    minibroker debug replica-log T P    one broker's replica of a partition, batch by batch
    minibroker metadata-quorum describe the controller quorum: active controller, voters' lag
    minibroker user create|delete|list  users' SCRAM credentials
    minibroker acl add|list|remove      ACLs
    minibroker quota set|remove|list    client quotas (users, client ids)

Client commands take -b/--bootstrap-server (also before the command: `minibroker -b
HOST:PORT topic list`; env MINIBROKER_BOOTSTRAP_SERVERS; default 127.0.0.1:9092).
Errors print one line on stderr and exit 1; --debug shows the traceback and the
client's debug log. The servers are started as subprocesses by module name, never
imported.

The commands by job: records.py (produce, consume), operations.py (cluster, topic,
debug), groups.py (consumer groups), quorum.py (metadata-quorum), users.py (SCRAM
users), acls.py (ACLs), quotas.py (client quotas); the command group, the servers and
`dev` in root.py; what they share in plumbing.py. Importing this package registers every
command.
"""

from __future__ import annotations

from client.cli import acls  # noqa: F401 (registers the commands)
from client.cli import groups  # noqa: F401 (registers the commands)
from client.cli import operations  # noqa: F401 (registers the commands)
from client.cli import quorum  # noqa: F401 (registers the commands)
from client.cli import quotas  # noqa: F401 (registers the commands)
from client.cli import records  # noqa: F401 (registers the commands)
from client.cli import users  # noqa: F401 (registers the commands)
from client.cli.plumbing import _parse_configs
from client.cli.records import _formatter
from client.cli.root import cli
from client.cli.root import main

__all__ = ["_formatter", "_parse_configs", "cli", "main"]
