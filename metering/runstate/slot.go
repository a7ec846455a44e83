package runstate

import (
	"strings"

	"github.com/redis/go-redis/v9"
)

// ClusterSlots is the number of hash slots of a Redis Cluster.
const ClusterSlots = 16384

// Slot is the Redis Cluster hash slot of key: CRC16 (XMODEM) of its hash tag, the text between
// its first '{' and the first '}' after it when that text is not empty, else of the whole key,
// modulo ClusterSlots (the cluster specification's HASH_SLOT). A Cluster refuses a script, a
// multi-key command or a MULTI/EXEC whose keys are in more than one slot (CROSSSLOT), whatever
// node holds them.
func Slot(key string) int {
	if i := strings.IndexByte(key, '{'); i >= 0 {
		if j := strings.IndexByte(key[i+1:], '}'); j > 0 {
			key = key[i+1 : i+1+j]
		}
	}
	var crc uint16
	for k := 0; k < len(key); k++ {
		crc ^= uint16(key[k]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return int(crc) % ClusterSlots
}

// oneTransaction reports whether commands on keys may go in one MULTI/EXEC, or one script,
// through rdb: always on one Redis server (the gateway's Client, a Sentinel-failover Client),
// only when they share a hash slot on a Cluster client, which refuses a transaction across
// slots (go-redis's ErrCrossSlot, before anything is sent) as a Cluster node refuses such a
// script.
func oneTransaction(rdb redis.UniversalClient, keys ...string) bool {
	if _, cluster := rdb.(*redis.ClusterClient); !cluster || len(keys) == 0 {
		return true
	}
	slot := Slot(keys[0])
	for _, k := range keys[1:] {
		if Slot(k) != slot {
			return false
		}
	}
	return true
}
