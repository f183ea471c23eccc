# shellcheck shell=bash disable=SC2034
# The site's directory (sourced by common.sh): users who exist only in LDAP, as on most university clusters.
#   - slapd (Debian's OpenLDAP) on the head, on its testbed address (ldap://head/), its database on the
#     machine's disk (LDAP_DIR); root loads entries over its own Unix socket (ldapi, SASL EXTERNAL: no password);
#   - every host resolves users through NSS: its /etc/nsswitch.conf (testbed/hosts.sh binds HOSTS_DIR's) asks
#     the local files first, then ldap, which Debian's libnss-ldapd serves through nslcd; each host runs an
#     nslcd of its own (its /run/nslcd is the host's), which asks slapd over the testbed's network, so a host
#     cut off the network loses the directory, as on a site without a caching client (SSSD caches);
#   - the directory's users get subordinate ids from etc/subid-ranges.sh, the admin guide's script, written
#     once into /etc/subuid and /etc/subgid, which every host shares here (a site runs it on each host).
LDAP_DIR=/var/lib/dlsub-testbed/ldap
LDAP_SOCKET=/run/dlsub-testbed/ldapi
LDAP_PIDFILE="$LDAP_DIR/run/slapd.pid"  # slapd writes it as openldap
LDAP_BASE="dc=dlsub,dc=test"
# The job user who exists only in the directory, with a uid in its range (etc/subid-ranges.sh's default).
TESTBED_LDAP_USER="${DLSUB_TESTBED_LDAP_USER:-dlldap}"
TESTBED_LDAP_UID=10001

# What each host's NSS and nslcd read (bound over /etc/nsswitch.conf and /etc/nslcd.conf by host_setup):
# written before the hosts are made.
ldap_host_files() {
    local group=root
    getent group nslcd >/dev/null && group=nslcd  # `make demo` installs no directory: its hosts use the files
    sed -E 's/^(passwd|group):([[:space:]]+)files.*/\1:\2files ldap/' /etc/nsswitch.conf \
        | host_file 644 root "$HOSTS_DIR/nsswitch.conf"
    printf 'uid nslcd\ngid nslcd\nuri ldap://%s/\nbase %s\n' "$(host_addr "$HEAD_HOST")" "$LDAP_BASE" \
        | host_file 640 "$group" "$HOSTS_DIR/nslcd.conf"
}

# Standard input into a file the hosts bind, replaced only when it differs (a new file is a new inode, which
# hosts already made would not see: directory_files_bound_again binds it again).
host_file() {  # mode group path
    local new
    new="$(cat)"
    [ -f "$3" ] && [ "$(cat "$3")" = "$new" ] && [ "$(stat -c %a:%G "$3")" = "$1:$2" ] && return 0
    printf '%s\n' "$new" | install -m "$1" -g "$2" /dev/stdin "$3"
}

ldapi_url() {
    printf 'ldapi://%s/' "${LDAP_SOCKET//\//%2F}"
}

slapd_conf() {
    cat <<EOF
include /etc/ldap/schema/core.schema
include /etc/ldap/schema/cosine.schema
include /etc/ldap/schema/nis.schema
include /etc/ldap/schema/inetorgperson.schema
modulepath /usr/lib/ldap
moduleload back_mdb
pidfile $LDAP_PIDFILE
database mdb
suffix "$LDAP_BASE"
rootdn "gidNumber=0+uidNumber=0,cn=peercred,cn=external,cn=auth"
directory $LDAP_DIR/data
maxsize 104857600
index uid,uidNumber,gidNumber,memberUid eq
access to attrs=userPassword by anonymous auth by * none
access to * by * read
EOF
}

ldap_up() {
    install -d -m 755 "$LDAP_DIR"
    install -d -m 700 -o openldap -g openldap "$LDAP_DIR/data" "$LDAP_DIR/run"
    slapd_conf | install -m 644 /dev/stdin "$LDAP_DIR/slapd.conf"
    if ! pid_alive "$LDAP_PIDFILE"; then
        say "starting slapd on $HEAD_HOST"
        rm -f "$LDAP_SOCKET"
        on_host "$HEAD_HOST" slapd -f "$LDAP_DIR/slapd.conf" -u openldap -g openldap \
            -h "ldap://$(host_addr "$HEAD_HOST")/ $(ldapi_url)" </dev/null >/dev/null
    fi
    for _ in $(seq 1 50); do
        ldapsearch -LLL -Q -Y EXTERNAL -H "$(ldapi_url)" -s base -b "" namingContexts >/dev/null 2>&1 && break
        sleep 0.2
    done
    ldap_add "dn: $LDAP_BASE
objectClass: dcObject
objectClass: organization
dc: dlsub
o: dlsub testbed

dn: ou=people,$LDAP_BASE
objectClass: organizationalUnit
ou: people

dn: ou=groups,$LDAP_BASE
objectClass: organizationalUnit
ou: groups"
    local host
    for host in $TESTBED_HOSTS; do
        directory_files_bound_again "$host" && stop_pidfile "$HOSTS_DIR/$host/run-nslcd/nslcd.pid"
        pid_alive "$HOSTS_DIR/$host/run-nslcd/nslcd.pid" && continue
        on_host "$host" nslcd </dev/null >/dev/null
    done
}

# Binds ldap_host_files' files again on a host that no longer reads them; true when it did (its nslcd read the
# others and must start again). A host made by
# `make demo` (no directory) outlives it into `make test`, whose apt-get installs nslcd and libnss-ldapd: they
# replace the machine's /etc/nslcd.conf and /etc/nsswitch.conf, which drops the hosts' bind mounts on them
# (Linux unmounts what was mounted on a file replaced in another namespace), and each host's nslcd then read
# Debian's file ("uri: wrong number of arguments"). ldap_host_files itself writes new files (install): a bind
# to the old one keeps its old owner, which the nslcd user may not read.
directory_files_bound_again() {  # host
    local host="$1" f bound=1
    getent passwd nslcd >/dev/null && chown nslcd:nslcd "$HOSTS_DIR/$host/run-nslcd"
    for f in nsswitch.conf nslcd.conf; do
        [ "$(on_host "$host" stat -c %d:%i "/etc/$f")" = "$(stat -c %d:%i "$HOSTS_DIR/$f")" ] && continue
        say "binding the directory's /etc/$f on $host again (the machine's was replaced since the host was made)"
        on_host "$host" umount "/etc/$f" 2>/dev/null || true
        on_host "$host" mount --bind "$HOSTS_DIR/$f" "/etc/$f"
        bound=0
    done
    return "$bound"
}

# Entries added where missing (ldapadd -c: one already there is no error).
ldap_add() {  # ldif
    local out
    out="$(ldapadd -c -Q -Y EXTERNAL -H "$(ldapi_url)" <<<"$1" 2>&1)" \
        || grep -q "Already exists" <<<"$out" || die "ldapadd failed: $out"
}

# A user and their own group, in the directory only.
ldap_user() {  # name uid
    local name="$1" uid="$2"
    ldap_add "dn: cn=$name,ou=groups,$LDAP_BASE
objectClass: posixGroup
cn: $name
gidNumber: $uid

dn: uid=$name,ou=people,$LDAP_BASE
objectClass: inetOrgPerson
objectClass: posixAccount
uid: $name
cn: $name
sn: $name
uidNumber: $uid
gidNumber: $uid
homeDirectory: /home/$name
loginShell: /bin/bash"
}

ldap_down() {
    local host
    for host in $TESTBED_HOSTS; do
        stop_pidfile "$HOSTS_DIR/$host/run-nslcd/nslcd.pid"
    done
    stop_pidfile "$LDAP_PIDFILE"
}
