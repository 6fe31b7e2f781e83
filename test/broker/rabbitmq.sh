# shellcheck shell=bash
# A throw-away RabbitMQ node (Debian's rabbitmq-server) for test/suites/broker.sh and
# bench/broker_soak.sh. Source it after test/lib.sh.
#
#   rabbit_start DIR AMQP_PORT   start a node whose every file lies in DIR (its mnesia, logs,
#                                config, Erlang cookie), listening for AMQP on 127.0.0.1:AMQP_PORT,
#                                its Erlang distribution on AMQP_PORT+1, its own epmd on
#                                AMQP_PORT+2 (never the shared epmd on 4369: a second run, or
#                                another user's node, cannot clash), rabbitmqctl's own
#                                distribution on AMQP_PORT+3 or +4, all on 127.0.0.1; waits until
#                                it serves AMQP
#   rabbit_stop                  stop it and its epmd (the EXIT trap of test/lib.sh calls it too)
#   rabbit_ctl ARGS...           rabbitmqctl against it
#
# The node runs as root's child with HOME=DIR (the cookie); a node of a run killed with -9 is
# stopped by the next run that uses the same DIR (its pid file).

RABBIT_DIR=""
RABBIT_BIN=/usr/lib/rabbitmq/bin

rabbit_env() {
  local dir="$RABBIT_DIR" port="$RABBIT_PORT"
  env HOME="$dir" \
    RABBITMQ_NODENAME="idem$port@localhost" \
    RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 RABBITMQ_NODE_PORT="$port" \
    RABBITMQ_DIST_PORT="$((port + 1))" ERL_EPMD_PORT="$((port + 2))" ERL_EPMD_ADDRESS=127.0.0.1 \
    RABBITMQ_MNESIA_BASE="$dir/mnesia" RABBITMQ_LOG_BASE="$dir/log" \
    RABBITMQ_CONFIG_FILE="$dir/rabbitmq" RABBITMQ_ADVANCED_CONFIG_FILE="$dir/advanced.config" \
    RABBITMQ_CONF_ENV_FILE="$dir/rabbitmq-env.conf" \
    RABBITMQ_ENABLED_PLUGINS_FILE="$dir/enabled_plugins" RABBITMQ_ENABLED_PLUGINS="" \
    RABBITMQ_PID_FILE="$dir/rabbit.pid" RABBITMQ_LOGS="$dir/log/node.log" \
    RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}" \
    RABBITMQ_CTL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}" \
    RABBITMQ_CTL_DIST_PORT_MIN="$((port + 3))" RABBITMQ_CTL_DIST_PORT_MAX="$((port + 4))" \
    "$@"
}

rabbit_ctl() { rabbit_env "$RABBIT_BIN/rabbitmqctl" -q "$@"; }

rabbit_start() {
  RABBIT_DIR="$1" RABBIT_PORT="$2"
  rabbit_stop_stale
  rm -rf "$RABBIT_DIR"
  mkdir -p "$RABBIT_DIR/log" "$RABBIT_DIR/mnesia"
  # The cookie: a new random one per run, readable by its owner only (Erlang insists).
  head -c 20 /dev/urandom | od -An -tx1 | tr -d ' \n' >"$RABBIT_DIR/.erlang.cookie"
  chmod 400 "$RABBIT_DIR/.erlang.cookie"
  : >"$RABBIT_DIR/rabbitmq-env.conf"
  echo "[]." >"$RABBIT_DIR/enabled_plugins"
  echo "[]." >"$RABBIT_DIR/advanced.config"
  cat >"$RABBIT_DIR/rabbitmq.conf" <<CONF
listeners.tcp.1 = 127.0.0.1:$RABBIT_PORT
loopback_users.guest = true
log.console = false
log.file.level = warning
disk_free_limit.absolute = 50MB
vm_memory_high_watermark.relative = 0.6
CONF
  idem_install_traps
  RABBIT_STARTED=1
  (cd "$RABBIT_DIR" && rabbit_env setsid "$RABBIT_BIN/rabbitmq-server" >"$RABBIT_DIR/log/startup.log" 2>&1 &)
  # Until it serves AMQP (rabbitmqctl await_startup): a bounded wait, a failure when it does not.
  if ! rabbit_env timeout 120 "$RABBIT_BIN/rabbitmqctl" -q wait --timeout 110 "$RABBIT_DIR/rabbit.pid" \
    >"$RABBIT_DIR/log/wait.log" 2>&1; then
    tail -30 "$RABBIT_DIR/log/startup.log" "$RABBIT_DIR/log/wait.log" >&2
    return 1
  fi
}

# A node left by a run killed with -9 in the same DIR: stopped by its pid file.
rabbit_stop_stale() {
  local pid
  [[ -f $RABBIT_DIR/rabbit.pid ]] || return 0
  pid="$(cat "$RABBIT_DIR/rabbit.pid")"
  [[ $pid =~ ^[0-9]+$ ]] && kill -KILL "$pid" 2>/dev/null
  rabbit_env epmd -port "$((RABBIT_PORT + 2))" -kill >/dev/null 2>&1 || true
}

rabbit_stop() {
  [[ -n $RABBIT_DIR && ${RABBIT_STARTED:-} == 1 ]] || return 0
  RABBIT_STARTED=0
  rabbit_env timeout 60 "$RABBIT_BIN/rabbitmqctl" -q stop "$RABBIT_DIR/rabbit.pid" >/dev/null 2>&1 || {
    local pid
    pid="$(cat "$RABBIT_DIR/rabbit.pid" 2>/dev/null)"
    [[ $pid =~ ^[0-9]+$ ]] && kill -KILL "$pid" 2>/dev/null
  }
  # Our own epmd (on its own port): nobody else uses it.
  ERL_EPMD_PORT="$((RABBIT_PORT + 2))" epmd -kill >/dev/null 2>&1 || true
  return 0
}
