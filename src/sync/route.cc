// Route planning: choosing, reading and linking a pull's route (see route.h).
#include "src/sync/route.h"

#include <algorithm>
#include <chrono>
#include <set>

#include "src/common/clock.h"
#include "src/common/parallel.h"
#include "src/common/status_macros.h"

namespace arc_v3 {
namespace sync {

const ObjectRef& RefOf(const Hop& hop, size_t shard) {
  return hop.anchor[shard] ? hop.m.shards[shard].anchor : hop.m.shards[shard].delta;
}

// What a hop costs, from its root: per shard its delta (its anchor where it has none), or
// at an anchor step every anchor.
uint64_t ChainCost(const StepManifest& m) { return m.chain_bytes; }
uint64_t AnchorCost(const StepManifest& m) { return m.anchor_bytes; }

namespace {

// The roots PlanRoute read back from the target: `back` descends from it, to the region's
// step `from` where the chain meets it (chain_ok), or as far as the anchor route needs.
struct Walk {
  std::vector<Hop> back;
  uint64_t from = kNoStep;
  std::string from_incarnation;
  uint64_t anchor_step = kNoStep;
  bool chain_ok = false;
  size_t anchor_index = SIZE_MAX;  // the anchor step's position in `back`
};

// The root of the base step of `cur` (`*pruned` where it is gone), checked under trust
// against the SHA-256 `cur` names.
Status ReadBaseHop(Store* store, const StepManifest& cur, const Trust& trust, Hop* prev,
                   bool* pruned, PullReport* report) {
  std::vector<uint8_t> bytes;
  Status s = ReadRoot(store, cur.base_step, &prev->m, &bytes);
  report->requests += 1;
  report->fetched_bytes += bytes.size();
  *pruned = s.code() == ErrorCode::kNotFound;
  if (*pruned) return Status::Ok();
  ARC_V3_RETURN_IF_ERROR(UnderTrust(trust, s));
  prev->manifest_xxh3 = checkpoint::Hash(bytes.data(), bytes.size());
  prev->root_sha256 = DigestHex(Sha256(bytes.data(), bytes.size()));
  const std::string name = store->url() + "/" + RootKey(prev->m.step);
  if (trust.on()) {
    ARC_V3_RETURN_IF_ERROR(CheckTrusted(trust, prev->m, name));
    if (prev->root_sha256 != cur.base_root_sha256) {
      return Status(ErrorCode::kUntrusted, name + " is not the base root step " +
                                               std::to_string(cur.step) +
                                               " names (its SHA-256 differs)");
    }
  }
  // The root names its base's bytes by XXH3 too: a route is a chain of hashes.
  if (cur.base_root_xxh3 != 0 && prev->manifest_xxh3 != cur.base_root_xxh3) {
    return UnderTrust(trust, Status(ErrorCode::kCorruptChunk, name + " is not the base root step " +
                                                                  std::to_string(cur.step) +
                                                                  " names (its XXH3 differs)"));
  }
  return Status::Ok();
}

// The cheaper of the routes the walk found: the chain from the region's step, or the anchor
// and the deltas after it (`only_chain`: the chain or nothing).
Status ChooseRoute(Store* store, const Walk& walk, bool only_chain, Route* route) {
  const uint64_t S = walk.from, A = walk.anchor_step;
  const StepManifest* anchor =
      walk.anchor_index != SIZE_MAX ? &walk.back[walk.anchor_index].m : nullptr;
  uint64_t chain_cost = UINT64_MAX, anchor_cost = UINT64_MAX;
  if (walk.chain_ok) {
    chain_cost = 0;
    for (const Hop& h : walk.back) {
      if (h.m.step > S) chain_cost += ChainCost(h.m);
    }
  }
  if (anchor != nullptr) {
    anchor_cost = AnchorCost(*anchor);
    for (const Hop& h : walk.back) {
      if (h.m.step > A) anchor_cost += ChainCost(h.m);
    }
  }
  const uint64_t target = walk.back.front().m.step;
  if (chain_cost == UINT64_MAX && anchor_cost == UINT64_MAX) {
    return Status(ErrorCode::kNotFound,
                  "step " + std::to_string(target) +
                      " cannot be rebuilt: the chain back to its anchor (step " +
                      std::to_string(A) + ") is gone from " + store->url() + " (pruned?)");
  }
  if (only_chain && chain_cost == UINT64_MAX) {
    return Status(ErrorCode::kNotFound, "the directory's step " + std::to_string(S) +
                                            " is not on the chain to step " +
                                            std::to_string(target));
  }
  route->from_dir = chain_cost <= anchor_cost || only_chain;
  if (!route->from_dir) {
    // The anchor route starts at an anchor step that every step after it names.
    for (const Hop& h : walk.back) {
      if (h.m.step >= A && h.m.anchor_step != A) {
        return Status(ErrorCode::kCorruptHeader,
                      "step " + std::to_string(h.m.step) + " names step " +
                          std::to_string(h.m.anchor_step) + " as its anchor step, not " +
                          std::to_string(A) + " as step " + std::to_string(target) + " does");
      }
    }
  }
  if (route->from_dir) route->from_incarnation = walk.from_incarnation;
  route->bytes = std::min(chain_cost, anchor_cost);
  const uint64_t first = route->from_dir ? S + 1 : A;
  for (auto it = walk.back.rbegin(); it != walk.back.rend(); ++it) {
    if (it->m.step < first) continue;
    route->hops.push_back(*it);
  }
  const uint64_t N = route->hops.back().m.step;
  route->anchor_step = A;
  route->name = route->from_dir ? "chain " + std::to_string(S) + " -> " + std::to_string(N)
                                : "anchor " + std::to_string(A) + " -> " + std::to_string(N);
  return Status::Ok();
}

}  // namespace

Status PlanRoute(Store* store, const RouteFrom* state, Hop target, Route* route, PullReport* report,
                 const Trust& trust) {
  Walk walk;
  walk.from = state != nullptr ? state->step : kNoStep;  // stays set for the cost below
  if (state != nullptr) walk.from_incarnation = state->incarnation;
  const uint64_t S = walk.from;
  const bool only_chain = state != nullptr && state->only_chain;
  const uint64_t A = walk.anchor_step = target.m.anchor_step;
  std::vector<Hop>& back = walk.back;
  back.push_back(std::move(target));
  uint64_t before_anchor = 0;  // what the route from DIR pays for the hops (S, A]
  for (;;) {
    const size_t i = back.size() - 1;
    const StepManifest& cur = back[i].m;
    if (cur.step == A) walk.anchor_index = i;
    if (state != nullptr && cur.step == S) {
      walk.chain_ok = back[i].manifest_xxh3 == state->manifest_xxh3 && cur.count == state->count &&
                      (!trust.on() ||
                       (!state->root_sha256.empty() && back[i].root_sha256 == state->root_sha256));
      if (walk.chain_ok) break;
      state = nullptr;  // DIR's step is another store's: only the anchor route is left
    }
    if (cur.base_step == kNoStep) break;
    // The root names its base's: a region at the base step needs no second look.
    if (state != nullptr && cur.base_step == S && cur.base_root_xxh3 != 0) {
      // Under trust the XXH3 is a pre-check only: the signed link's SHA-256 decides.
      walk.chain_ok = cur.base_root_xxh3 == state->manifest_xxh3 && cur.count == state->count &&
                      (!trust.on() ||
                       (!state->root_sha256.empty() && cur.base_root_sha256 == state->root_sha256));
      if (walk.chain_ok) break;
      state = nullptr;
    }
    if (cur.step <= A) {
      // Below the anchor only the route from DIR goes on, while it costs less than the anchor.
      if (state == nullptr || cur.base_step < S) break;
      before_anchor += ChainCost(cur);
      if (walk.anchor_index != SIZE_MAX && before_anchor > AnchorCost(back[walk.anchor_index].m))
        break;
    }
    Hop prev;
    bool pruned = false;
    ARC_V3_RETURN_IF_ERROR(ReadBaseHop(store, cur, trust, &prev, &pruned, report));
    if (pruned) break;  // only what is left can be used
    back.push_back(std::move(prev));
  }
  return UnderTrust(trust, ChooseRoute(store, walk, only_chain, route));
}

namespace {

// A hop's deltas continue the hop before it (PROTOCOL.md, "Reading a route"): the same
// shard count, and each applied delta's base_incarnation that root's incarnation.
// The first hop of a route from the region's step continues that step, whose incarnation
// the region recorded (count: PlanRoute checked it).
Status CheckLinks(const Route& route) {
  for (size_t h = 0; h < route.hops.size(); ++h) {
    const Hop& hop = route.hops[h];
    const bool from_region = h == 0;
    if (from_region && (!route.from_dir || route.from_incarnation.empty())) continue;
    const uint64_t base_step = from_region ? hop.m.base_step : route.hops[h - 1].m.step;
    const uint32_t base_count = from_region ? hop.m.count : route.hops[h - 1].m.count;
    const std::string& base_incarnation =
        from_region ? route.from_incarnation : route.hops[h - 1].m.incarnation;
    for (size_t k = 0; k < hop.m.count; ++k) {
      const ShardRecord& r = hop.m.shards[k];
      if (hop.anchor[k] || !r.loaded) continue;
      if (hop.m.count != base_count || r.base_incarnation != base_incarnation) {
        return Status(ErrorCode::kCorruptHeader,
                      "step " + std::to_string(hop.m.step) + " shard " + std::to_string(k) +
                          " continues incarnation '" + r.base_incarnation + "' of " +
                          std::to_string(hop.m.count) + " shards, but its base step " +
                          std::to_string(base_step) + " is incarnation '" + base_incarnation +
                          "' of " + std::to_string(base_count));
      }
    }
  }
  return Status::Ok();
}

}  // namespace

Status LoadRoute(Store* store, const Select* select, LayoutCache* layouts, Route* route,
                 PullReport* report, const Trust& trust) {
  const uint32_t count = route->hops.back().m.count;
  ReadCost cost;
  Status s;
  route->touched.assign(count, true);
  if (select != nullptr) {
    // The layouts first (cached by hash: a run's layout rarely changes), then the records
    // of the shards that hold a selected tensor at some hop.
    const std::vector<bool> none(count, false);
    std::fill(route->touched.begin(), route->touched.end(), false);
    for (Hop& hop : route->hops) {
      s = LoadShards(store, &hop.m, &none, layouts, &cost, trust.on());
      if (!s.ok()) break;
      for (size_t k = 0; k < hop.m.count && k < count; ++k) {
        for (const std::string& name : hop.m.shards[k].names) {
          if (!route->touched[k] && std::regex_match(name, select->pattern))
            route->touched[k] = true;
        }
      }
    }
  }
  for (Hop& hop : route->hops) {
    if (!s.ok()) break;
    s = LoadShards(store, &hop.m, select != nullptr ? &route->touched : nullptr, layouts, &cost,
                   trust.on());
    hop.anchor.assign(hop.m.count, true);
    const bool start = !route->from_dir && hop.m.step == route->anchor_step;
    for (size_t k = 0; k < hop.m.count; ++k)
      hop.anchor[k] = start || !hop.m.shards[k].delta.present();
  }
  if (s.ok()) s = CheckLinks(*route);
  report->requests += cost.requests;
  report->fetched_bytes += cost.bytes;
  return UnderTrust(trust, s);
}

Status ReadTarget(Store* store, uint64_t step, Hop* target, PullReport* report,
                  const Trust& trust) {
  const bool latest = step == kLatestStep;
  if (!latest && step > kMaxStep) {
    return Status(ErrorCode::kInvalidArgument,
                  "there is no step " + std::to_string(step) + ": steps are at most " +
                      std::to_string(kMaxStep) + " (kLatestStep asks for the newest)");
  }
  if (latest) {
    Status s = ReadLatest(store, &step, nullptr);
    report->requests += 1;
    if (!s.ok()) return UnderTrust(trust, s);
    const uint64_t named = step;
    step = ProbeLater(store, step);
    report->requests += step - named + 1;
  }
  std::vector<uint8_t> bytes;
  Status s = ReadRoot(store, step, &target->m, &bytes);
  report->requests += 1;
  report->fetched_bytes += bytes.size();
  if (s.code() == ErrorCode::kNotFound && latest) {
    return Status(ErrorCode::kNotFound,
                  "the latest pointer of " + store->url() + " names step " + std::to_string(step) +
                      ", which is not committed (no root); " + "nothing was changed");
  }
  if (s.code() == ErrorCode::kNotFound) {
    // A store arc_v3 1.x published to has no roots, and a `latest` of version 1.
    uint64_t ignored = 0;
    const Status latest_status = ReadLatest(store, &ignored, nullptr);
    if (latest_status.code() == ErrorCode::kUnsupportedVersion) return latest_status;
  }
  ARC_V3_RETURN_IF_ERROR(UnderTrust(trust, s));
  ARC_V3_RETURN_IF_ERROR(CheckTrusted(trust, target->m, store->url() + "/" + RootKey(step)));
  target->manifest_xxh3 = checkpoint::Hash(bytes.data(), bytes.size());
  target->root_sha256 = DigestHex(Sha256(bytes.data(), bytes.size()));
  report->to_step = step;
  report->published_at = target->m.published_at;
  report->committed_at = target->m.committed_at;
  return Status::Ok();
}

}  // namespace sync
}  // namespace arc_v3