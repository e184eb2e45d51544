// What the machine can give: memory available to a new reservation (MemAvailable).
#pragma once

#include <cstdint>

namespace kvs {

// Bytes of RAM available now (/proc/meminfo's MemAvailable; all physical RAM if unreadable).
int64_t AvailableRamBytes();

}  // namespace kvs
