// SPDX-License-Identifier: Apache-2.0
//
// Socket-level translation of Service external IPs to ClusterIPs.
//
// Attached to a cgroup v2 directory, these programs run for every socket created under it,
// whatever its network namespace. A connect() (TCP, connected UDP) or an unconnected UDP
// sendmsg() to (external IP, protocol, port) of an entry is rewritten to (ClusterIP, same port)
// before the kernel routes anything, so no packet is NATed and no conntrack entry is made.
// The address the application asked for is remembered per socket so that getpeername() and the
// source address of a received UDP datagram show it instead of the ClusterIP.
//
// Addresses and ports are kept in network byte order exactly as the socket context holds them;
// the userspace side writes map keys and values in the same layout.
//
// Every translation is counted, per CPU, by the family of the entry that translated it and by
// where the socket lives: the node's network namespace ("node": its processes, host-network
// pods) or any other ("pods"). A connect() counts once, an unconnected sendmsg() once per
// datagram.

#include <linux/bpf.h>
#include <linux/in.h>
#include <bpf/bpf_helpers.h>
#include <bpf/bpf_endian.h>

// Keep in step with src/backends/ebpf/map-codec.ts.
#define MAX_ENTRIES 65536
#define MAX_SOCKET_ORIGINS 65536

// Slots of the translated map: keep in step with src/backends/ebpf/counters.ts.
#define COUNTER_IPV4 0
#define COUNTER_IPV6 2
#define COUNTER_NODE 1
#define COUNTER_SLOTS 4

struct entry_key_v4 {
	__u32 addr;
	__u16 port;
	__u8 protocol;
	__u8 pad;
};

struct entry_value_v4 {
	__u32 addr;
	__u16 port;
	__u16 pad;
};

struct entry_key_v6 {
	__u32 addr[4];
	__u16 port;
	__u8 protocol;
	__u8 pad;
};

struct entry_value_v6 {
	__u32 addr[4];
	__u16 port;
	__u16 pad;
};

// One translated destination of one socket. An unconnected UDP socket can talk to several
// ClusterIPs, so the ClusterIP and port are part of the key. IPv4 addresses are stored
// IPv4-mapped (::ffff:a.b.c.d) so that a dual-stack IPv6 socket talking to an IPv4 Service
// finds the same record.
struct origin_key {
	__u64 cookie;
	__u32 addr[4];
	__u16 port;
	__u16 pad;
	__u32 pad2;
};

struct origin_value {
	__u32 addr[4];
	__u16 port;
	__u16 pad;
};

// Entries change from userspace only, rarely: allocate elements on demand.
struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_ENTRIES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct entry_key_v4);
	__type(value, struct entry_value_v4);
} entries_v4 SEC(".maps");

struct {
	__uint(type, BPF_MAP_TYPE_HASH);
	__uint(max_entries, MAX_ENTRIES);
	__uint(map_flags, BPF_F_NO_PREALLOC);
	__type(key, struct entry_key_v6);
	__type(value, struct entry_value_v6);
} entries_v6 SEC(".maps");

// Socket cookies are never reused within a boot, so a stale record can only waste a slot until
// the LRU evicts it; it can never be found by another socket.
struct {
	__uint(type, BPF_MAP_TYPE_LRU_HASH);
	__uint(max_entries, MAX_SOCKET_ORIGINS);
	__type(key, struct origin_key);
	__type(value, struct origin_value);
} socket_origins SEC(".maps");

// Translations made, per CPU: slot COUNTER_IPV4 or COUNTER_IPV6, plus COUNTER_NODE for a socket
// in the node's network namespace. Userspace sums the CPUs' values.
struct {
	__uint(type, BPF_MAP_TYPE_PERCPU_ARRAY);
	__uint(max_entries, COUNTER_SLOTS);
	__type(key, __u32);
	__type(value, __u64);
} translated SEC(".maps");

// The node's network namespace cookie, written by the loader before it attaches (the namespace
// it runs in). 0 when the kernel could not tell it (SO_NETNS_COOKIE is Linux 5.14+): then the
// initial network namespace is the node's.
struct {
	__uint(type, BPF_MAP_TYPE_ARRAY);
	__uint(max_entries, 1);
	__type(key, __u32);
	__type(value, __u64);
} node_netns SEC(".maps");

#define SOCK_ADDR_ALLOW 1

static __always_inline void count_translation(struct bpf_sock_addr *ctx, __u32 family_slot)
{
	__u32 zero = 0;
	const __u64 *node = bpf_map_lookup_elem(&node_netns, &zero);
	__u64 node_cookie = node && *node ? *node : bpf_get_netns_cookie(NULL);
	__u32 slot = family_slot + (bpf_get_netns_cookie(ctx) == node_cookie ? COUNTER_NODE : 0);
	__u64 *n = bpf_map_lookup_elem(&translated, &slot);

	// Another task may run this program on the same CPU when this one is preempted.
	if (n)
		__sync_fetch_and_add(n, 1);
}

static __always_inline int is_v4_mapped(const __u32 addr[4])
{
	return addr[0] == 0 && addr[1] == 0 && addr[2] == bpf_htonl(0x0000ffff);
}

static __always_inline void remember_origin(struct bpf_sock_addr *ctx, const __u32 translated[4],
					    __u16 translated_port, const __u32 original[4],
					    __u16 original_port)
{
	struct origin_key key = {};
	struct origin_value value = {};

	key.cookie = bpf_get_socket_cookie(ctx);
	key.addr[0] = translated[0];
	key.addr[1] = translated[1];
	key.addr[2] = translated[2];
	key.addr[3] = translated[3];
	key.port = translated_port;
	value.addr[0] = original[0];
	value.addr[1] = original[1];
	value.addr[2] = original[2];
	value.addr[3] = original[3];
	value.port = original_port;
	bpf_map_update_elem(&socket_origins, &key, &value, BPF_ANY);
}

static __always_inline const struct origin_value *find_origin(struct bpf_sock_addr *ctx,
							      const __u32 peer[4], __u16 peer_port)
{
	struct origin_key key = {};

	key.cookie = bpf_get_socket_cookie(ctx);
	key.addr[0] = peer[0];
	key.addr[1] = peer[1];
	key.addr[2] = peer[2];
	key.addr[3] = peer[3];
	key.port = peer_port;
	return bpf_map_lookup_elem(&socket_origins, &key);
}

// IPv4 destination (an AF_INET socket, or the IPv4 half of an IPv4-mapped address).
// Returns the translation, or NULL when (addr, protocol, port) is not an entry.
static __always_inline const struct entry_value_v4 *lookup_v4(__u32 addr, __u16 port, __u8 protocol)
{
	struct entry_key_v4 key = {};

	key.addr = addr;
	key.port = port;
	key.protocol = protocol;
	return bpf_map_lookup_elem(&entries_v4, &key);
}

static __always_inline int translate_v4(struct bpf_sock_addr *ctx)
{
	__u32 addr = ctx->user_ip4;
	__u16 port = (__u16)ctx->user_port;
	const struct entry_value_v4 *to = lookup_v4(addr, port, (__u8)ctx->protocol);

	if (!to)
		return SOCK_ADDR_ALLOW;
	__u32 translated[4] = { 0, 0, bpf_htonl(0x0000ffff), to->addr };
	__u32 original[4] = { 0, 0, bpf_htonl(0x0000ffff), addr };
	__u16 translated_port = to->port;

	remember_origin(ctx, translated, translated_port, original, port);
	count_translation(ctx, COUNTER_IPV4);
	ctx->user_ip4 = translated[3];
	ctx->user_port = translated_port;
	return SOCK_ADDR_ALLOW;
}

static __always_inline int translate_v6(struct bpf_sock_addr *ctx)
{
	__u32 original[4];
	__u32 translated[4];
	__u16 port = (__u16)ctx->user_port;
	__u16 translated_port;
	__u32 family_slot;

	original[0] = ctx->user_ip6[0];
	original[1] = ctx->user_ip6[1];
	original[2] = ctx->user_ip6[2];
	original[3] = ctx->user_ip6[3];

	if (is_v4_mapped(original)) {
		// A dual-stack socket (Java does this by default) reaching an IPv4 external IP.
		const struct entry_value_v4 *to = lookup_v4(original[3], port, (__u8)ctx->protocol);

		if (!to)
			return SOCK_ADDR_ALLOW;
		translated[0] = original[0];
		translated[1] = original[1];
		translated[2] = original[2];
		translated[3] = to->addr;
		translated_port = to->port;
		family_slot = COUNTER_IPV4;
	} else {
		struct entry_key_v6 key = {};

		key.addr[0] = original[0];
		key.addr[1] = original[1];
		key.addr[2] = original[2];
		key.addr[3] = original[3];
		key.port = port;
		key.protocol = (__u8)ctx->protocol;
		const struct entry_value_v6 *to = bpf_map_lookup_elem(&entries_v6, &key);

		if (!to)
			return SOCK_ADDR_ALLOW;
		translated[0] = to->addr[0];
		translated[1] = to->addr[1];
		translated[2] = to->addr[2];
		translated[3] = to->addr[3];
		translated_port = to->port;
		family_slot = COUNTER_IPV6;
	}

	remember_origin(ctx, translated, translated_port, original, port);
	count_translation(ctx, family_slot);
	ctx->user_ip6[0] = translated[0];
	ctx->user_ip6[1] = translated[1];
	ctx->user_ip6[2] = translated[2];
	ctx->user_ip6[3] = translated[3];
	ctx->user_port = translated_port;
	return SOCK_ADDR_ALLOW;
}

// The peer address the kernel reports (getpeername, recvmsg source) goes back to the external
// IP when this socket's traffic to it was translated.
static __always_inline int restore_v4(struct bpf_sock_addr *ctx)
{
	__u32 peer[4] = { 0, 0, bpf_htonl(0x0000ffff), ctx->user_ip4 };
	const struct origin_value *origin = find_origin(ctx, peer, (__u16)ctx->user_port);

	if (origin) {
		ctx->user_ip4 = origin->addr[3];
		ctx->user_port = origin->port;
	}
	return SOCK_ADDR_ALLOW;
}

static __always_inline int restore_v6(struct bpf_sock_addr *ctx)
{
	__u32 peer[4];

	peer[0] = ctx->user_ip6[0];
	peer[1] = ctx->user_ip6[1];
	peer[2] = ctx->user_ip6[2];
	peer[3] = ctx->user_ip6[3];
	const struct origin_value *origin = find_origin(ctx, peer, (__u16)ctx->user_port);

	if (origin) {
		ctx->user_ip6[0] = origin->addr[0];
		ctx->user_ip6[1] = origin->addr[1];
		ctx->user_ip6[2] = origin->addr[2];
		ctx->user_ip6[3] = origin->addr[3];
		ctx->user_port = origin->port;
	}
	return SOCK_ADDR_ALLOW;
}

SEC("cgroup/connect4")
int connect4(struct bpf_sock_addr *ctx)
{
	return translate_v4(ctx);
}

SEC("cgroup/connect6")
int connect6(struct bpf_sock_addr *ctx)
{
	return translate_v6(ctx);
}

SEC("cgroup/sendmsg4")
int sendmsg4(struct bpf_sock_addr *ctx)
{
	return translate_v4(ctx);
}

SEC("cgroup/sendmsg6")
int sendmsg6(struct bpf_sock_addr *ctx)
{
	return translate_v6(ctx);
}

SEC("cgroup/recvmsg4")
int recvmsg4(struct bpf_sock_addr *ctx)
{
	return restore_v4(ctx);
}

SEC("cgroup/recvmsg6")
int recvmsg6(struct bpf_sock_addr *ctx)
{
	return restore_v6(ctx);
}

SEC("cgroup/getpeername4")
int getpeername4(struct bpf_sock_addr *ctx)
{
	return restore_v4(ctx);
}

SEC("cgroup/getpeername6")
int getpeername6(struct bpf_sock_addr *ctx)
{
	return restore_v6(ctx);
}

char LICENSE[] SEC("license") = "Apache-2.0";
