# shellcheck shell=bash
# venv.sh — sourced by scripts/test-env.sh and scripts/cuda-tools.sh: a virtual environment of
# pinned PyPI packages, cached outside the clone and made again when the pins change (a stamp file
# in it holds the pins it was made with).
#   venv_current VENV REQS...        status 0 when VENV is complete with exactly these pins
#   venv_create NAME VENV WHAT REQS... make it (python3-venv installed first where missing) and
#                                    install the pins; the caller checks them, then venv_stamp
#   venv_stamp VENV REQS...          record the pins: the environment is complete
venv_current() {
  local venv=$1
  shift
  [ -x "$venv/bin/python" ] && [ "$(cat "$venv/.fsdpd-reqs" 2>/dev/null)" = "$*" ]
}
venv_create() {
  local name=$1 venv=$2 what=$3 sudo=""
  shift 3
  if ! /usr/bin/python3 -c "import venv, ensurepip" 2>/dev/null; then
    [ "$(id -u)" -eq 0 ] || sudo=sudo
    DEBIAN_FRONTEND=noninteractive $sudo apt-get install -y -qq --no-install-recommends python3-venv >&2
  fi
  echo "$name: creating $venv ($what, once)" >&2
  mkdir -p "$(dirname "$venv")"
  /usr/bin/python3 -m venv "$venv"
  "$venv/bin/pip" install -q --disable-pip-version-check "$@" >&2
}
venv_stamp() {
  local venv=$1
  shift
  echo "$*" >"$venv/.fsdpd-reqs"
}
