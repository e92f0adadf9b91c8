"""``llmgw server init``: moving a running control service's store into a replicated
cluster (PostgreSQL + Patroni + etcd) over ssh. The Patroni inventory and client URL
(:mod:`.patroni`), the ssh checks (:mod:`.ssh`), the playbook run and its progress
(:mod:`.runner`, :mod:`.progress`), the data move (:mod:`.move`), the switch of the
control service's store env file (:mod:`.switch`), and the steps in order (:mod:`.init`).

Only the control host's ``server init`` loads this package; it needs the ``server-init``
extra (``pip install 'llmgw[server-init]'``: ansible-core, the ansible collections,
ansible-runner), which agents and routers do not install."""
