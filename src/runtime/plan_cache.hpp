// A device's cache of plans keyed by problem signature (a byte string). Guarded by its own lock:
// nothing mutable is shared between devices, and threads of one device may race on it safely.
#pragma once

#include <cstdint>
#include <list>
#include <memory>
#include <mutex>
#include <string>
#include <unordered_map>
#include <utility>

#include "core/fault.hpp"

namespace attnops {

struct PlanBase {
    virtual ~PlanBase() = default;
};

class PlanCache {
public:
    static constexpr size_t kCapacity = 64;               // plans kept per device (LRU)
    static constexpr size_t kMaxKeyBytes = 1 << 20;       // larger signatures are planned, not cached

    template <typename Plan, typename Make>
    std::shared_ptr<const Plan> getOrMake(const std::string& key, Make&& make) {
        allocationPoint();  // the key, and the plan when it is not cached
        if (key.size() > kMaxKeyBytes) return std::make_shared<const Plan>(make());
        {
            std::lock_guard<std::mutex> lock(mutex_);
            auto it = index_.find(key);
            if (it != index_.end()) {
                order_.splice(order_.begin(), order_, it->second);
                ++hits_;
                return std::static_pointer_cast<const Plan>(it->second->second);
            }
        }
        auto plan = std::make_shared<const Plan>(make());  // planned outside the lock
        std::lock_guard<std::mutex> lock(mutex_);
        if (index_.count(key) == 0) {
            order_.emplace_front(key, plan);
            index_[key] = order_.begin();
            if (order_.size() > kCapacity) {
                index_.erase(order_.back().first);
                order_.pop_back();
            }
        }
        ++misses_;
        return plan;
    }

    void clear() {
        std::lock_guard<std::mutex> lock(mutex_);
        index_.clear();
        order_.clear();
    }

    std::pair<uint64_t, uint64_t> hitsAndMisses() const {
        std::lock_guard<std::mutex> lock(mutex_);
        return {hits_, misses_};
    }

private:
    using Entry = std::pair<std::string, std::shared_ptr<const PlanBase>>;
    mutable std::mutex mutex_;
    std::list<Entry> order_;
    std::unordered_map<std::string, std::list<Entry>::iterator> index_;
    uint64_t hits_ = 0, misses_ = 0;
};

}  // namespace attnops
