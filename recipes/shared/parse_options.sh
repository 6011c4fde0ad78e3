# Sourced by a recipe's run.sh after it has set its defaults: `source ../shared/parse_options.sh "$@"`.
# `--foo-bar VALUE` sets the variable foo_bar, which must have a default; a variable whose default
# is `false` is a flag (`--foo-bar` sets it to true). -h/--help prints the script's header
# comment. Every other argument (Hydra overrides) goes to the array `overrides`.

overrides=()
while [[ $# -gt 0 ]]; do
  case "$1" in
    -h|--help) sed -n '2,/^set -euo pipefail/p' "$(basename "$0")" | sed '$d' | sed 's/^# \{0,1\}//'; exit 0 ;;
    --*)
      option_name=${1#--}
      option_name=${option_name//-/_}
      if [[ ! $option_name =~ ^[a-z][a-z0-9_]*$ || -z ${!option_name+x} ]]; then
        echo "run.sh: unknown option $1 (see --help)" >&2
        exit 2
      fi
      if [[ ${!option_name} == false ]]; then
        printf -v "$option_name" true
        shift
      else
        [[ $# -ge 2 ]] || { echo "run.sh: option $1 needs a value" >&2; exit 2; }
        printf -v "$option_name" '%s' "$2"
        shift 2
      fi ;;
    *) overrides+=("$1"); shift ;;
  esac
done
