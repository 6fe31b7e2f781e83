-- The Citus recipe (README, "Scaling out with Citus"), run on the coordinator as a superuser
-- after CREATE EXTENSION citus on every node and the workers added: the key table is
-- distributed by key, and the key functions (claim, complete, release, checkpoint, look, forget) are delegated by their first argument, so
-- every call for one key runs on the node that holds its shard.
CREATE EXTENSION idempotency;
SELECT create_distributed_table('idempotency.idempotency_keys', 'key');
SELECT create_distributed_function('idempotency.claim_key(text,bytea,text,interval,interval,interval)',
                                   '$1', colocate_with := 'idempotency.idempotency_keys', force_delegation := true);
SELECT create_distributed_function('idempotency.complete_key(text,uuid,jsonb,integer,text,bytea,jsonb,interval)',
                                   '$1', colocate_with := 'idempotency.idempotency_keys', force_delegation := true);
SELECT create_distributed_function('idempotency.release_key(text,uuid,text)',
                                   '$1', colocate_with := 'idempotency.idempotency_keys', force_delegation := true);
SELECT create_distributed_function('idempotency.checkpoint_key(text,uuid,text,text,interval)',
                                   '$1', colocate_with := 'idempotency.idempotency_keys', force_delegation := true);
SELECT create_distributed_function('idempotency.look_key(text,bytea,text)',
                                   '$1', colocate_with := 'idempotency.idempotency_keys', force_delegation := true);
SELECT create_distributed_function('idempotency.forget_key(text,uuid,text)',
                                   '$1', colocate_with := 'idempotency.idempotency_keys', force_delegation := true);
