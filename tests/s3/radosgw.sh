#!/usr/bin/env bash
# Boots a throwaway single-host Ceph radosgw (S3 server) on 127.0.0.1, offline, for tests and CI.
#
#   tests/s3/radosgw.sh start  DIR [PORT]  # wipe DIR, boot mon+osd+radosgw, create user and bucket,
#                                          # write DIR/env.sh (S3 endpoint, credentials, bucket)
#   tests/s3/radosgw.sh stop   DIR         # stop the daemons started from DIR; 0 if none ran
#   tests/s3/radosgw.sh status DIR         # exit 0 if the gateway from DIR answers, else 1
#
# PORT (default $RADOSGW_PORT or 7480) is the S3 port; the monitor listens on PORT+1 unless
# RADOSGW_MON_PORT is set, so instances side by side need ports at least 2 apart.
# RADOSGW_ADDR (default 127.0.0.1) is the address the gateway listens on (0.0.0.0 serves the
# network namespaces of bench/cross_region.py). RADOSGW_MEMSTORE_BYTES (default 8 GiB) caps the data held: the OSD uses memstore, objects
# live in RAM (OSD RSS ~1.5x the data) and vanish on stop. All state (config, data, sockets, pids, logs) stays in DIR.
#
# Needs the Debian packages ceph-mon ceph-osd radosgw ceph-common awscli (and curl); the
# project's installer third_party/install_deps.sh is where they are installed.
set -euo pipefail
unset CEPH_ARGS CEPH_CONF   # a caller's settings must not leak into this instance

readonly ACCESS_KEY=arcv3test
readonly SECRET_KEY=arcv3testsecret
readonly BUCKET=arc-v3-test
readonly PUBLIC_BUCKET=arc-v3-public
readonly REGION=us-east-1
readonly MARKER=.radosgw-sh   # marks DIR as ours, so start only ever wipes a directory it made
readonly BOOT_TIMEOUT=${RADOSGW_BOOT_TIMEOUT:-60}   # seconds for the gateway to answer

die() { echo "radosgw.sh: error: $*" >&2; exit 1; }
log() { echo "radosgw.sh: $*" >&2; }

usage() {
  sed -n '3,7s/^# \{0,1\}//p' "$0" >&2
  exit 2
}

check_deps() {
  local missing=() pair bin pkg
  for pair in ceph-mon:ceph-mon ceph-osd:ceph-osd radosgw:radosgw radosgw-admin:ceph-common \
              ceph:ceph-common ceph-authtool:ceph-common monmaptool:ceph-base curl:curl \
              timeout:coreutils; do
    bin=${pair%%:*} pkg=${pair#*:}
    command -v "$bin" >/dev/null 2>&1 || missing+=("$pkg (for $bin)")
  done
  # Debian's awscli; an `aws` found on PATH may be a broken pyenv shim, so use this path only.
  [ -x /usr/bin/aws ] || missing+=("awscli (for /usr/bin/aws)")
  if [ ${#missing[@]} -gt 0 ]; then
    die "missing packages: ${missing[*]}; install with: apt-get install ceph-mon ceph-osd radosgw ceph-common awscli curl (see third_party/install_deps.sh)"
  fi
}

# Pids of live processes whose command line names this instance's config file: the daemons
# (with or without pid files) and any stuck CLI calls. Never matches another instance.
instance_pids() {
  local conf=$1 p
  for p in /proc/[0-9]*; do
    [ -r "$p/cmdline" ] || continue
    if tr '\0' '\n' 2>/dev/null < "$p/cmdline" | grep -qxF -- "$conf"; then
      echo "${p#/proc/}"
    fi
  done
}

# Running and not a zombie: daemons are reparented to an init that may reap them late.
alive() {
  local st
  st=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  st=${st##*) }
  [ "${st%% *}" != Z ]
}

# TERM the given pids, KILL whatever is left after 5 s; returns once all are gone.
terminate() {
  local p i left
  kill -TERM "$@" 2>/dev/null || true
  for i in $(seq 100); do
    left=0
    for p in "$@"; do if alive "$p"; then left=1; fi; done
    [ $left = 0 ] && return 0
    if [ "$i" = 50 ]; then
      for p in "$@"; do
        if alive "$p"; then log "pid $p ignored TERM for 5 s, killing"; kill -KILL "$p" 2>/dev/null || true; fi
      done
    fi
    sleep 0.1
  done
  die "pids $* still running after KILL"
}

do_stop() {
  local dir=$1 conf=$1/ceph.conf rgw=() osd=() mon=() p f cmd
  [ -d "$dir" ] || return 0
  # Daemons by pid file (only if the pid is still ours: pids get reused), plus any started from
  # DIR that died before writing one, plus hung ceph/radosgw-admin calls.
  for p in $( (cat "$dir"/run/*.pid 2>/dev/null || true; instance_pids "$conf") | sort -un); do
    alive "$p" || continue
    cmd=$(tr '\0' '\n' 2>/dev/null < "/proc/$p/cmdline") || continue
    grep -qxF -- "$conf" <<<"$cmd" || continue
    case ${cmd%%$'\n'*} in
      *ceph-mon) mon+=("$p") ;;
      *ceph-osd) osd+=("$p") ;;
      *) rgw+=("$p") ;;
    esac
  done
  # In this order: radosgw hangs on exit without its OSD, the OSD waits 5 s on exit for the
  # monitor's acknowledgement.
  [ ${#rgw[@]} -eq 0 ] || terminate "${rgw[@]}"
  [ ${#osd[@]} -eq 0 ] || terminate "${osd[@]}"
  [ ${#mon[@]} -eq 0 ] || terminate "${mon[@]}"
  f=$((${#rgw[@]} + ${#osd[@]} + ${#mon[@]}))
  [ $f -eq 0 ] || log "stopped $f process(es) from $dir"
  rm -f "$dir"/run/*.pid "$dir"/run/*.asok
}

gateway_port() {
  local dir=$1
  [ -f "$dir/ports" ] || return 1
  sed -n 's/^RGW_PORT=//p' "$dir/ports"
}

answers() { curl -sf -o /dev/null --max-time 2 "http://127.0.0.1:$1/"; }

dump_logs() {
  local dir=$1 f
  for f in "$dir"/log/mon.a.log "$dir"/log/osd.0.log "$dir"/log/client.rgw.a.log; do
    [ -f "$f" ] || continue
    echo "----- tail of $f -----" >&2
    tail -n 25 "$f" >&2
  done
}

fail_boot() {
  local dir=$1; shift
  echo "radosgw.sh: error: $*" >&2
  dump_logs "$dir"
  do_stop "$dir" || true
  exit 1
}

write_conf() {
  local dir=$1 mon_port=$2 rgw_port=$3 fsid=$4 mem_bytes=$5
  cat > "$dir/ceph.conf" <<EOF
[global]
fsid = $fsid
mon initial members = a
mon host = v1:127.0.0.1:$mon_port
public addr = 127.0.0.1
cluster addr = 127.0.0.1
ms bind ipv4 = true
ms bind ipv6 = false
ms bind msgr2 = false
auth cluster required = none
auth service required = none
auth client required = none
keyring = $dir/keyring
run dir = $dir/run
admin socket = $dir/run/\$name.asok
pid file = $dir/run/\$name.pid
log file = $dir/log/\$name.log
crash dir = $dir/crash
mon cluster log file = $dir/log/cluster.log
log to stderr = false
err to stderr = true
osd pool default size = 1
osd pool default min size = 1
osd pool default pg num = 8
osd pool default pgp num = 8
osd crush chooseleaf type = 0
mon allow pool size one = true
mon allow pool delete = true
mon max pg per osd = 1000
mon warn on pool no redundancy = false
# CI disks are often nearly full; the monitor must not refuse to run because of that.
mon data avail warn = 1
mon data avail crit = 0

[mon]
mon data = $dir/mon/\$id
err to stderr = false
# Every pool radosgw creates costs a map change; the default 1 s batching made boot ~14 s.
paxos propose interval = 0.05
paxos min wait = 0.01

[osd]
osd data = $dir/osd/\$id
err to stderr = false
osd objectstore = memstore
memstore device bytes = $mem_bytes
# The OSD's first monitor commands at start can race the monmap's arrival and fail with
# "wrong fsid" (auth none), killing the OSD: so start adds its crush entry itself beforehand.
osd class update on start = false
osd crush update on start = false
# Exit at once on TERM: a clean memstore shutdown would first copy every object to disk.
osd fast shutdown = true

[client]
# CLI clients (ceph, radosgw-admin) may run concurrently: one socket each.
admin socket = $dir/run/\$name.\$pid.asok

[client.rgw.a]
err to stderr = false
admin socket = $dir/run/\$name.asok
rgw data = $dir/rgw
rgw frontends = beast endpoint=${RADOSGW_ADDR:-127.0.0.1}:$rgw_port tcp_nodelay=1
EOF
}

do_start() {
  local dir=$1 rgw_port=$2
  local mon_port=${RADOSGW_MON_PORT:-$((rgw_port + 1))}
  local mem_bytes=${RADOSGW_MEMSTORE_BYTES:-$((8 << 30))}
  local t0 t1 fsid osd_uuid osd_id i f p
  check_deps
  [[ $rgw_port =~ ^[0-9]+$ && $mon_port =~ ^[0-9]+$ ]] || die "ports must be numbers: $rgw_port $mon_port"

  mkdir -p "$dir"
  dir=$(cd "$dir" && pwd -P)   # absolute: it goes into the config and the daemons' cmdlines
  local conf=$dir/ceph.conf
  do_stop "$dir"
  t0=$(date +%s%N)
  if [ -n "$(ls -A "$dir")" ] && [ ! -e "$dir/$MARKER" ]; then
    die "$dir is not empty and was not made by radosgw.sh; refusing to wipe it"
  fi
  find "$dir" -mindepth 1 -delete
  touch "$dir/$MARKER"
  mkdir -p "$dir"/{run,log,crash,mon/a,osd/0,rgw}
  printf 'RGW_PORT=%s\nMON_PORT=%s\n' "$rgw_port" "$mon_port" > "$dir/ports"

  for p in "$rgw_port" "$mon_port"; do
    if (exec 3<>"/dev/tcp/127.0.0.1/$p") 2>/dev/null; then
      die "port $p on 127.0.0.1 is already in use (set PORT / RADOSGW_MON_PORT)"
    fi
  done

  fsid=$(cat /proc/sys/kernel/random/uuid)
  osd_uuid=$(cat /proc/sys/kernel/random/uuid)
  write_conf "$dir" "$mon_port" "$rgw_port" "$fsid" "$mem_bytes"
  local ceph=(timeout 30 ceph -c "$conf" --connect-timeout 20)

  # Auth is off, but mon --mkfs still wants a keyring with a mon. key.
  ceph-authtool -C "$dir/keyring" --gen-key -n mon. --cap mon 'allow *' >/dev/null
  ceph-authtool "$dir/keyring" --gen-key -n client.admin --cap mon 'allow *' \
    --cap osd 'allow *' --cap mgr 'allow *' >/dev/null
  monmaptool --create --fsid "$fsid" --addv a "[v1:127.0.0.1:$mon_port]" "$dir/monmap" >/dev/null \
    || fail_boot "$dir" "monmaptool failed"
  ceph-mon -c "$conf" -i a --mkfs --monmap "$dir/monmap" --keyring "$dir/keyring" \
    || fail_boot "$dir" "ceph-mon --mkfs failed"
  ceph-mon -c "$conf" -i a || fail_boot "$dir" "ceph-mon failed to start"

  osd_id=$("${ceph[@]}" osd create "$osd_uuid") || fail_boot "$dir" "'ceph osd create' failed (monitor not reachable?)"
  [ "$osd_id" = 0 ] || fail_boot "$dir" "expected osd id 0, got '$osd_id'"
  "${ceph[@]}" osd crush add osd.0 1.0 root=default host=localhost >/dev/null 2>&1 \
    || fail_boot "$dir" "'ceph osd crush add' failed"
  ceph-osd -c "$conf" -i 0 --mkfs --osd-uuid "$osd_uuid" >/dev/null 2>&1 \
    || fail_boot "$dir" "ceph-osd --mkfs failed"
  ceph-osd -c "$conf" -i 0 || fail_boot "$dir" "ceph-osd failed to start"

  radosgw -c "$conf" -n client.rgw.a || fail_boot "$dir" "radosgw failed to start"

  # The gateway creates its pools on first start, so it answers only once the OSD is up.
  for i in $(seq $((BOOT_TIMEOUT * 5))); do
    answers "$rgw_port" && break
    for f in mon.a osd.0 client.rgw.a; do
      p=$(cat "$dir/run/$f.pid" 2>/dev/null || true)
      [ -n "$p" ] && ! alive "$p" && fail_boot "$dir" "$f exited during boot"
    done
    [ "$i" = $((BOOT_TIMEOUT * 5)) ] && fail_boot "$dir" "gateway on 127.0.0.1:$rgw_port did not answer within ${BOOT_TIMEOUT}s"
    sleep 0.2
  done

  timeout 60 radosgw-admin -c "$conf" user create --uid=arcv3test --display-name="arc v3 test" \
    --access-key="$ACCESS_KEY" --secret-key="$SECRET_KEY" >/dev/null \
    || fail_boot "$dir" "radosgw-admin user create failed"
  # curl's SigV4 (7.75+) avoids awscli's second of Python start-up; S3 wants the payload hash header.
  local code
  code=$(curl -s -o "$dir/log/create-bucket.out" -w '%{http_code}' --max-time 30 -X PUT \
    --aws-sigv4 "aws:amz:$REGION:s3" --user "$ACCESS_KEY:$SECRET_KEY" \
    -H 'x-amz-content-sha256: UNSIGNED-PAYLOAD' "http://127.0.0.1:$rgw_port/$BUCKET") || code=000
  [ "$code" = 200 ] || fail_boot "$dir" "creating bucket $BUCKET failed: HTTP $code $(cat "$dir/log/create-bucket.out" 2>/dev/null)"
  # A second bucket that anyone may read, as a CDN or web server in front of a bucket would
  # serve it: the tests of read-only http(s):// stores read it without credentials.
  code=$(curl -s -o "$dir/log/create-bucket.out" -w '%{http_code}' --max-time 30 -X PUT \
    --aws-sigv4 "aws:amz:$REGION:s3" --user "$ACCESS_KEY:$SECRET_KEY" \
    -H 'x-amz-content-sha256: UNSIGNED-PAYLOAD' "http://127.0.0.1:$rgw_port/$PUBLIC_BUCKET") || code=000
  [ "$code" = 200 ] || fail_boot "$dir" "creating bucket $PUBLIC_BUCKET failed: HTTP $code"
  local policy='{"Version":"2012-10-17","Statement":[{"Effect":"Allow","Principal":{"AWS":["*"]},"Action":["s3:GetObject"],"Resource":["arn:aws:s3:::'"$PUBLIC_BUCKET"'/*"]}]}'
  code=$(curl -s -o "$dir/log/bucket-policy.out" -w '%{http_code}' --max-time 30 -X PUT \
    --aws-sigv4 "aws:amz:$REGION:s3" --user "$ACCESS_KEY:$SECRET_KEY" \
    -H 'x-amz-content-sha256: UNSIGNED-PAYLOAD' --data-binary "$policy" \
    "http://127.0.0.1:$rgw_port/$PUBLIC_BUCKET?policy=") || code=000
  case "$code" in 200|204) ;; *) fail_boot "$dir" "setting the policy of $PUBLIC_BUCKET failed: HTTP $code $(cat "$dir/log/bucket-policy.out" 2>/dev/null)" ;; esac

  cat > "$dir/env.sh" <<EOF
export AWS_ENDPOINT_URL=http://127.0.0.1:$rgw_port
export AWS_ACCESS_KEY_ID=$ACCESS_KEY
export AWS_SECRET_ACCESS_KEY=$SECRET_KEY
export AWS_REGION=$REGION
export AWS_DEFAULT_REGION=$REGION
export ARC_V3_TEST_BUCKET=$BUCKET
export ARC_V3_TEST_S3=s3://$BUCKET
export ARC_V3_TEST_PUBLIC_S3=s3://$PUBLIC_BUCKET
export ARC_V3_TEST_PUBLIC_HTTP=http://127.0.0.1:$rgw_port/$PUBLIC_BUCKET
EOF
  t1=$(date +%s%N)
  echo "$dir/env.sh"
  local ms=$(((t1 - t0) / 1000000))
  printf 'radosgw.sh: radosgw up on http://127.0.0.1:%s (mon %s), boot took %d.%03d s\n' \
    "$rgw_port" "$mon_port" $((ms / 1000)) $((ms % 1000)) >&2
}

[ $# -ge 2 ] || usage
cmd=$1 dir=$2
case $cmd in
  start)
    [ $# -le 3 ] || usage
    do_start "$dir" "${3:-${RADOSGW_PORT:-7480}}"
    ;;
  stop)
    [ $# -eq 2 ] || usage
    [ -d "$dir" ] || exit 0
    do_stop "$(cd "$dir" && pwd -P)"
    ;;
  status)
    [ $# -eq 2 ] || usage
    port=$(gateway_port "$dir" 2>/dev/null) || exit 1
    [ -n "$port" ] && answers "$port" || exit 1
    ;;
  *) usage ;;
esac
