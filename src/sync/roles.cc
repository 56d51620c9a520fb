// The in-memory roles of arc_v3_sync.hpp: a trainer rank's Publisher and a rollout
// engine's Follower, over the sync layer and the container's in-memory apply.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <future>
#include <map>
#include <system_error>

#include "arc_v3_sync.hpp"
#include "src/checkpoint/checkpoint_delta.h"
#include "src/checkpoint/tensor_apply.h"
#include "src/common/clock.h"
#include "src/common/parallel.h"
#include "src/common/status_macros.h"
#include "src/sync/apply_hop.h"
#include "src/sync/follow.h"
#include "src/sync/route.h"
#include "src/sync/sync.h"

namespace arc_v3 {
namespace {

using Clock = std::chrono::steady_clock;

}  // namespace

struct Publisher::Impl {
  std::unique_ptr<sync::Store> store;
  PublisherOptions options;
  std::string file_name;
  uint64_t last_step = kNoStep;
  std::vector<NamedTensor> last;  // the tensors of last_step, pointing into `bytes`
  std::vector<std::vector<uint8_t>> bytes;
};

Publisher::Publisher(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Publisher::~Publisher() = default;

Status Publisher::Open(const std::string& store_url, const PublisherOptions& options,
                       std::unique_ptr<Publisher>* publisher) {
  if (options.count == 0 || options.shard >= options.count || options.count > sync::kMaxShards) {
    return Status(ErrorCode::kInvalidArgument,
                  "shard must be below count (at most " + std::to_string(sync::kMaxShards) + ")");
  }
  // The key first: a publisher that cannot sign leaves no new store directory behind.
  ARC_V3_RETURN_IF_ERROR(sync::CheckPublishKeys(options.sign_key, {}));
  auto impl = std::make_unique<Impl>();
  // A local store's first publish makes its directory.
  const sync::StoreOptions store_options = sync::ToStoreOptions(options.store, true);
  ARC_V3_RETURN_IF_ERROR(sync::OpenStore(store_url, store_options, &impl->store));
  if (!impl->store->writable())
    return Status(ErrorCode::kInvalidArgument, store_url + " is read-only");
  impl->options = options;
  impl->file_name = options.file_name;
  if (impl->file_name.empty()) {
    char name[64];
    std::snprintf(name, sizeof(name), "model-%05u-of-%05u.safetensors", options.shard + 1,
                  options.count);
    impl->file_name = name;
  }
  publisher->reset(new Publisher(std::move(impl)));
  return Status::Ok();
}

Status Publisher::Publish(uint64_t step, const std::vector<NamedTensor>& tensors,
                          PublishResult* result) {
  *result = PublishResult();
  Impl& p = *impl_;
  if (p.last_step != kNoStep && step <= p.last_step) {
    return Status(ErrorCode::kInvalidArgument,
                  "step " + std::to_string(step) + " does not come after step " +
                      std::to_string(p.last_step) + ", the last one published");
  }
  checkpoint::Checkpoint prev, next;
  ARC_V3_RETURN_IF_ERROR(checkpoint::Checkpoint::FromMemory(p.file_name, tensors, &next));
  if (p.last_step != kNoStep) {
    ARC_V3_RETURN_IF_ERROR(checkpoint::Checkpoint::FromMemory(p.file_name, p.last, &prev));
  }
  sync::PublishOptions o;
  o.step = step;
  o.base_step = p.last_step;
  o.shard = p.options.shard;
  o.count = p.options.count;
  o.anchor_every = p.options.anchor_every;
  o.incarnation =
      p.options.incarnation.empty() ? sync::DefaultIncarnation() : p.options.incarnation;
  o.sign_key = p.options.sign_key;
  o.checkpoint.threads = p.options.threads;
  o.checkpoint.effort = p.options.effort;
  sync::PublishReport report;
  ARC_V3_RETURN_IF_ERROR(
      sync::PublishCheckpoints(p.store.get(), o, prev, next, /*in_memory=*/true, &report));
  // The base of the next delta: a copy of what was just published.
  p.bytes.resize(tensors.size());
  p.last = tensors;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const checkpoint::TensorView& v = next.files()[0].tensors[i];
    p.bytes[i].assign(v.data, v.data + v.bytes);
    p.last[i].data = p.bytes[i].data();
  }
  p.last_step = step;
  result->committed = report.committed;
  result->pending = report.pending;
  result->delta_bytes = report.record.delta.size;
  result->anchor_bytes = report.record.anchor.size;
  result->uploaded_bytes = report.uploaded_bytes;
  result->encode_seconds = report.encode_seconds + report.hash_seconds;
  result->upload_seconds = report.upload_seconds;
  result->commit_seconds = report.commit_seconds;
  result->total_seconds = report.total_seconds;
  return Status::Ok();
}

uint64_t Publisher::last_step() const { return impl_->last_step; }

uint64_t Publisher::held_bytes() const {
  uint64_t bytes = 0;
  for (const auto& b : impl_->bytes) bytes += b.size();
  return bytes;
}

// What a follower holds: one step's tensors and the root they are of.
struct Held {
  uint64_t step = kNoStep;
  uint64_t manifest_xxh3 = 0;                   // of the step's root
  std::string root_sha256;                      // of the step's root, in hex
  std::string incarnation;                      // of the step's root
  uint64_t run = 0;                             // of the step
  std::vector<checkpoint::HeldTensors> shards;  // per shard
  std::vector<std::string> order;               // names in shard-then-file order
};

struct Follower::Impl {
  std::unique_ptr<sync::Store> store;
  FollowerOptions options;
  sync::StoreOptions store_options;
  sync::Select select;
  Allocator allocator;
  Held held;
  sync::Trust trust;
  sync::LayoutCache layouts;  // kept across steps: a run's layout rarely changes
  bool anchor_route = false;  // Follow: the next Pull goes by the anchor route

  Status ApplyHop(const sync::Hop& hop, const std::vector<bool>& touched, Held* into,
                  FollowResult* result, sync::PullReport* report);
  Status ApplyRoute(const sync::Route& route, FollowResult* result, sync::PullReport* report);
};

Follower::Follower(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
Follower::~Follower() = default;

Status Follower::Open(const std::string& store_url, const FollowerOptions& options,
                      std::unique_ptr<Follower>* follower) {
  auto impl = std::make_unique<Impl>();
  impl->store_options = sync::ToStoreOptions(options.store);
  ARC_V3_RETURN_IF_ERROR(sync::OpenStore(store_url, impl->store_options, &impl->store));
  impl->options = options;
  ARC_V3_RETURN_IF_ERROR(sync::LoadTrust(options.trusted_keys, &impl->trust));
  impl->select.sel.tensors = options.tensors;
  impl->select.sel.row_begin = options.row_begin;
  impl->select.sel.row_end = options.row_end;
  if (options.row_begin > options.row_end)
    return Status(ErrorCode::kInvalidArgument, "row_begin > row_end");
  try {
    impl->select.pattern =
        std::regex(options.tensors.empty() ? ".*" : options.tensors, std::regex::ECMAScript);
  } catch (const std::regex_error& e) {
    return Status(ErrorCode::kInvalidArgument,
                  "bad tensors regex '" + options.tensors + "': " + e.what());
  }
  impl->allocator = [](const std::string&, const std::string&, const std::vector<uint64_t>&,
                       uint64_t, uint64_t, uint64_t bytes, void** data,
                       std::shared_ptr<void>* owner) {
    void* memory = std::calloc(1, bytes > 0 ? bytes : 1);
    if (memory == nullptr)
      return Status(ErrorCode::kOutOfMemory, "cannot allocate " + std::to_string(bytes) + " bytes");
    *data = memory;
    *owner = std::shared_ptr<void>(memory, std::free);
    return Status::Ok();
  };
  follower->reset(new Follower(std::move(impl)));
  return Status::Ok();
}

void Follower::set_allocator(Allocator allocator) { impl_->allocator = std::move(allocator); }

uint64_t Follower::step() const { return impl_->held.step; }

std::vector<FollowedTensor> Follower::tensors() const {
  std::vector<FollowedTensor> out;
  for (size_t k = 0; k < impl_->held.shards.size(); ++k) {
    for (const auto& entry : impl_->held.shards[k]) {
      const checkpoint::HeldTensor& h = entry.second;
      out.push_back({entry.first, h.dtype, h.shape, h.row_begin, h.row_end, h.data, k,
                     std::regex_match(entry.first, impl_->select.pattern)});
    }
  }
  std::map<std::string, size_t> rank;
  for (size_t i = 0; i < impl_->held.order.size(); ++i) rank[impl_->held.order[i]] = i;
  std::stable_sort(out.begin(), out.end(), [&](const FollowedTensor& a, const FollowedTensor& b) {
    return rank[a.name] < rank[b.name];
  });
  return out;
}

namespace {

// The Follower's side of a hop: the shards' held tensors, updated in place, and new memory
// from its allocator. The committed shards' tensors gather in next() for the follower.
class TensorSink : public sync::HopSink {
 public:
  // `held`: per shard, what deltas apply onto (null: nothing held).
  TensorSink(const std::vector<checkpoint::HeldTensors>* held, const Follower::Allocator& allocator,
             size_t count)
      : held_(held), allocator_(allocator), next_(count), files_(count) {}
  Status Open(size_t k, const sync::Fetched& f, const checkpoint::HeldTensors** base) override {
    files_[k] = &f.file();
    *base = held_ != nullptr ? &(*held_)[k] : &none_;
    return Status::Ok();
  }
  Status Allocate(size_t, const checkpoint::TensorEntry& t, uint64_t begin, uint64_t end,
                  checkpoint::HeldTensor* held) override {
    void* data = nullptr;
    Status a = allocator_(t.name, t.dtype, t.shape, begin, end, (end - begin) * t.row_bytes(),
                          &data, &held->owner);
    held->data = static_cast<uint8_t*>(data);
    return a;
  }
  bool in_place() const override { return true; }
  Status Commit(size_t k, checkpoint::TensorApply* apply) override {
    changed_ += apply->changed_elements();
    undo_bytes_ += apply->undo_bytes();
    apply->Commit(&next_[k]);
    for (const checkpoint::TensorEntry& t : files_[k]->tensors) {
      if (next_[k].count(t.name) != 0) order_.push_back(t.name);
    }
    return Status::Ok();
  }

  // Per shard, its tensors after the hop (none for a shard not applied).
  std::vector<checkpoint::HeldTensors>& next() { return next_; }
  std::vector<std::string>& order() { return order_; }  // the committed tensors' names
  uint64_t changed() const { return changed_; }
  uint64_t undo_bytes() const { return undo_bytes_; }

 private:
  const std::vector<checkpoint::HeldTensors>* held_;
  const Follower::Allocator& allocator_;
  const checkpoint::HeldTensors none_;
  std::vector<checkpoint::HeldTensors> next_;
  std::vector<const checkpoint::FileEntry*> files_;
  std::vector<std::string> order_;
  uint64_t changed_ = 0, undo_bytes_ = 0;
};

// Batches of the shards read, in order, each needing at most `ahead_bytes` bytes (a shard
// needing more is a batch of its own, read piece by piece as it is decoded).
std::vector<std::vector<size_t>> Batches(const std::vector<sync::Fetched>& fetched,
                                         const sync::Select& select, uint64_t ahead_bytes) {
  std::vector<std::vector<size_t>> batches;
  uint64_t in_batch = 0;
  for (size_t k = 0; k < fetched.size(); ++k) {
    if (fetched[k].skipped) continue;
    const uint64_t bytes = sync::NeededBytes(fetched[k], select);
    if (batches.empty() || bytes > ahead_bytes - std::min(in_batch, ahead_bytes)) {
      batches.emplace_back();
      in_batch = 0;
    }
    batches.back().push_back(k);
    in_batch += bytes;
  }
  return batches;
}

}  // namespace

// Applies one step to every shard of `into`, all or nothing, by sync::ApplyHop. The shards'
// pieces are fetched ahead in batches of at most options.fetch_ahead_bytes, the next batch
// while the last one is decoded; each verified piece is written in place, the old values
// kept in the shard's undo record until every shard is done (Rollback on any error).
Status Follower::Impl::ApplyHop(const sync::Hop& hop, const std::vector<bool>& touched, Held* into,
                                FollowResult* result, sync::PullReport* report) {
  std::vector<checkpoint::HeldTensors>& shards = into->shards;
  const auto fetch = Clock::now();
  std::vector<sync::Fetched> fetched(hop.m.count);
  std::vector<size_t> object(hop.m.count);  // fetched[k] is shard k's
  for (size_t k = 0; k < hop.m.count; ++k) {
    fetched[k].shard = k;
    fetched[k].ref = sync::RefOf(hop, k);
    fetched[k].record = &hop.m.shards[k];
    fetched[k].skipped = !touched[k];  // holds no selected tensor: nothing of it is read
    object[k] = k;
  }
  ARC_V3_RETURN_IF_ERROR(
      sync::FetchHeads(store.get(), store_options, &select, &fetched, report, trust));
  const uint64_t ahead_bytes = options.fetch_ahead_bytes;
  sync::HopRun job;
  job.hop = &hop;
  job.object = &object;
  job.select = &select;
  job.fetched = &fetched;
  job.batches = Batches(fetched, select, ahead_bytes);
  job.fetch = [&](size_t j, sync::PullReport* counted) {
    return sync::FetchRanges(store.get(), store_options, ahead_bytes, ahead_bytes, select,
                             job.batches[j], &fetched, counted);
  };
  job.threads = options.threads;
  result->fetch_seconds += SecondsSince(fetch);
  // A changed shard count starts from nothing held (the anchor route).
  const bool same_count = shards.size() == hop.m.count;
  TensorSink sink(same_count ? &shards : nullptr, allocator, hop.m.count);
  sync::HopTimes times;
  const Status s = sync::ApplyHop(job, &sink, report, &times);
  result->fetch_seconds += times.fetch_seconds;
  result->decode_seconds += times.decode_seconds;
  if (!s.ok()) return s;
  const auto commit = Clock::now();
  std::vector<checkpoint::HeldTensors>& next = sink.next();
  for (size_t k = 0; k < hop.m.count; ++k) {
    if (same_count && fetched[k].skipped) next[k] = std::move(shards[k]);  // not read: kept as held
  }
  shards.swap(next);
  into->order.swap(sink.order());
  result->changed_elements = std::max(result->changed_elements, sink.changed());
  result->undo_bytes = std::max(result->undo_bytes, sink.undo_bytes());
  into->step = hop.m.step;
  into->manifest_xxh3 = hop.manifest_xxh3;
  into->root_sha256 = hop.root_sha256;
  into->incarnation = hop.m.incarnation;
  into->run = hop.m.run;
  result->commit_seconds += times.commit_seconds + SecondsSince(commit);
  result->steps.push_back(hop.m.step);
  return Status::Ok();
}

// Applies a route's hops. A route that starts at or below the step held (an anchor route)
// is applied to new memory until it passes that step, and only then replaces what is held:
// a route that fails leaves the follower at the step it held or a newer one, never older.
Status Follower::Impl::ApplyRoute(const sync::Route& route, FollowResult* result,
                                  sync::PullReport* report) {
  const bool behind =
      held.step != kNoStep && !route.hops.empty() && route.hops.front().m.step <= held.step;
  Held ahead;
  Held* into = behind ? &ahead : &held;
  for (const sync::Hop& hop : route.hops) {
    ARC_V3_RETURN_IF_ERROR(ApplyHop(hop, route.touched, into, result, report));
    if (into == &ahead && ahead.step > held.step) {
      held = std::move(ahead);
      into = &held;
    }
  }
  if (into == &ahead) held = std::move(ahead);  // a route to an older step, which passed
  return Status::Ok();
}

Status Follower::Pull(uint64_t step, FollowResult* result) {
  const auto start = Clock::now();
  *result = FollowResult();
  Impl& f = *impl_;
  result->from_step = f.held.step;
  sync::PullReport report;
  sync::Hop target;
  ARC_V3_RETURN_IF_ERROR(sync::ReadTarget(f.store.get(), step, &target, &report, f.trust));
  ARC_V3_RETURN_IF_ERROR(
      sync::CheckProgress(f.trust, f.held.step, f.held.run, target.m, "the follower"));
  result->step = target.m.step;
  result->published_at = target.m.published_at;
  result->committed_at = target.m.committed_at;
  Status s;
  if (f.held.step == target.m.step && f.held.manifest_xxh3 == target.manifest_xxh3 &&
      f.held.root_sha256 == target.root_sha256) {
    result->up_to_date = true;
    result->route = "up to date";
  } else {
    // Plans a route from `held` (null: nothing held), then applies it hop by hop.
    const auto go = [&](const sync::RouteFrom* held, sync::Hop to, sync::Route* route) {
      Status st = sync::PlanRoute(f.store.get(), held, std::move(to), route, &report, f.trust);
      if (st.ok()) {
        st = sync::LoadRoute(f.store.get(), f.select.sel.partial() ? &f.select : nullptr,
                             &f.layouts, route, &report, f.trust);
      }
      if (!st.ok()) return sync::UnderTrust(f.trust, st);
      result->route = route->name;
      st = f.ApplyRoute(*route, result, &report);
      // Under trust what fails a check is kUntrusted, which is never routed around.
      return sync::UnderTrust(f.trust, st);
    };
    const sync::RouteFrom from{f.held.step, f.held.manifest_xxh3, f.held.root_sha256,
                               static_cast<uint32_t>(f.held.shards.size()), f.held.incarnation};
    sync::Route route;
    s = go(f.held.step == kNoStep || f.anchor_route ? nullptr : &from, target, &route);
    if (sync::Damaged(s.code()) && !route.hops.empty()) {
      // The other route around what was met: a chain's step by the anchor route, an
      // anchor's by the chain from the step held now (whatever either costs).
      sync::RouteFrom now{f.held.step, f.held.manifest_xxh3, f.held.root_sha256,
                          static_cast<uint32_t>(f.held.shards.size()), f.held.incarnation};
      now.only_chain = true;
      sync::Route other;
      const Status again = route.from_dir           ? go(nullptr, target, &other)
                           : f.held.step != kNoStep ? go(&now, target, &other)
                                                    : Status(ErrorCode::kNotFound, "no step held");
      if (again.ok()) {
        result->rerouted = sync::ReroutedNote(s, other.name, route.name);
        s = again;
      } else {
        result->route = route.name;
        s = sync::NoOtherRoute(s, route.name, again);
      }
    }
  }
  result->fetched_bytes = report.fetched_bytes;
  result->requests = report.requests;
  result->total_seconds = SecondsSince(start);
  return s;
}

Status Follower::Follow(
    const FollowOptions& options,
    const std::function<bool(const FollowEvent& event, const FollowResult* pulled)>& on_event) {
  const auto open = [this](sync::Store** store) {
    *store = impl_->store.get();
    return Status::Ok();
  };
  const auto pull_step = [&](sync::Store*, uint64_t step, bool anchor, FollowEvent* event,
                             bool* stop) {
    FollowResult result;
    impl_->anchor_route = anchor;
    const Status s = Pull(step, &result);
    impl_->anchor_route = false;
    ARC_V3_RETURN_IF_ERROR(s);
    event->step = result.step;
    event->lag_seconds = UnixSeconds() - result.published_at;
    *stop = on_event && !on_event(*event, &result);
    return Status::Ok();
  };
  const auto note = [&](const FollowEvent& event) { return !on_event || on_event(event, nullptr); };
  return sync::FollowLatest(open, impl_->held.step, impl_->trust.on(), options, pull_step, note);
}

Status GenerateSigningKey(const std::string& path, std::string* key_id) {
  return sync::GenerateKey(path, key_id);
}

}  // namespace arc_v3
