// The in-memory roles (arc_v3_sync.hpp) on both stores: trainer ranks publishing from
// memory, followers updating their tensors in place, late and partial followers.
#include <doctest/doctest.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <thread>

#include "arc_v3_sync.hpp"
#include "src/sync/protocol.h"
#include "tests/sync/sync_test_util.h"

namespace arc_v3 {
namespace {

using sync::test::Backend;
using sync::test::TempDir;

// A trainer rank's tensors, moved by a sparse optimizer-like step.
struct Rank {
  std::vector<std::string> names;
  std::vector<std::vector<uint64_t>> shapes;
  std::vector<std::vector<uint16_t>> values;

  Rank(int r, uint32_t seed) {
    names = {"r" + std::to_string(r) + ".big", "r" + std::to_string(r) + ".norm",
             "r" + std::to_string(r) + ".w"};
    shapes = {{12000, 256}, {256}, {1024, 256}};
    std::mt19937 rng(seed);
    std::normal_distribution<float> normal(0.0f, 0.02f);
    for (const auto& shape : shapes) {
      uint64_t n = 1;
      for (uint64_t d : shape) n *= d;
      std::vector<uint16_t> v(n);
      for (auto& x : v) {
        const float f = normal(rng);
        uint32_t bits;
        std::memcpy(&bits, &f, 4);
        x = static_cast<uint16_t>(bits >> 16);
      }
      values.push_back(std::move(v));
    }
  }
  void Step(std::mt19937* rng) {
    for (auto& v : values) {
      for (size_t i = (*rng)() % 200; i < v.size(); i += 1 + (*rng)() % 400) {
        if ((v[i] & 0x7F) != 0 && (v[i] & 0x7F) != 0x7F) v[i] += ((*rng)() & 1) ? 1 : -1;
      }
    }
  }
  std::vector<NamedTensor> Tensors() const {
    std::vector<NamedTensor> out;
    for (size_t i = 0; i < names.size(); ++i)
      out.push_back({names[i], "BF16", shapes[i], values[i].data()});
    return out;
  }
};

// Whether the follower holds exactly the ranks' tensors (rows [begin, end) of `selected`).
void CheckHolds(const Follower& f, const std::vector<Rank>& ranks, uint64_t begin = 0,
                uint64_t end = UINT64_MAX, const std::string& selected = "") {
  std::map<std::string, FollowedTensor> held;
  for (const FollowedTensor& t : f.tensors()) held[t.name] = t;
  for (const Rank& r : ranks) {
    for (size_t i = 0; i < r.names.size(); ++i) {
      const std::string& name = r.names[i];
      if (!selected.empty() && name != selected) continue;
      REQUIRE(held.count(name) == 1);
      const FollowedTensor& t = held[name];
      const uint64_t rows = r.shapes[i][0], row = r.values[i].size() / rows;
      const uint64_t a = std::min(begin, rows), b = std::min(end, rows);
      REQUIRE(t.row_begin <= a);
      REQUIRE(t.row_end >= b);
      INFO("tensor ", name);
      CHECK(std::memcmp(static_cast<const uint16_t*>(t.data) + (a - t.row_begin) * row,
                        r.values[i].data() + a * row, (b - a) * row * 2) == 0);
    }
  }
}

// Flips a bit near the end of shard `shard`'s delta object of `step`; returns the object's
// key and its bytes before.
std::pair<std::string, std::vector<uint8_t>> DamageDelta(sync::Store* store, uint64_t step,
                                                         size_t shard) {
  sync::StepManifest m;
  REQUIRE(sync::ReadManifest(store, step, &m, nullptr).ok());
  std::vector<uint8_t> bytes;
  REQUIRE(store->Get(m.shards[shard].delta.key, 1u << 30, &bytes, nullptr).ok());
  std::vector<uint8_t> bad = bytes;
  bad[bad.size() - 10] ^= 1;
  REQUIRE(store->Put(m.shards[shard].delta.key, bad.data(), bad.size(), sync::PutMode::kOverwrite)
              .ok());
  return {m.shards[shard].delta.key, bytes};
}

// A publisher per rank of a world of `ranks`.
std::vector<std::unique_ptr<Publisher>> Publishers(const std::string& url, uint32_t ranks,
                                                   uint64_t anchor_every) {
  std::vector<std::unique_ptr<Publisher>> publishers(ranks);
  for (uint32_t r = 0; r < ranks; ++r) {
    PublisherOptions o;
    o.shard = r;
    o.count = ranks;
    o.anchor_every = anchor_every;
    REQUIRE(Publisher::Open(url, o, &publishers[r]).ok());
  }
  return publishers;
}

TEST_CASE(
    "roles: ranks publish from memory; followers update in place, catch up, or hold a slice") {
  TempDir tmp;
  for (Backend& b : sync::test::Backends(tmp, "roles")) {
    INFO("store ", b.name);
    std::vector<Rank> ranks = {Rank(0, 1), Rank(1, 2)};
    std::vector<std::unique_ptr<Publisher>> publishers = Publishers(b.url, 2, 4);
    std::unique_ptr<Follower> every, late, slice;
    REQUIRE(Follower::Open(b.url, {}, &every).ok());
    REQUIRE(Follower::Open(b.url, {}, &late).ok());
    FollowerOptions so;
    so.tensors = "r1\\.big";
    so.row_begin = 9000;
    so.row_end = 9050;
    REQUIRE(Follower::Open(b.url, so, &slice).ok());
    std::mt19937 rng(5);
    std::vector<const void*> pointers;
    for (uint64_t step = 0; step <= 6; ++step) {
      if (step > 0) {
        for (Rank& r : ranks) r.Step(&rng);
      }
      std::vector<Status> published(2);
      std::vector<PublishResult> results(2);
      std::vector<std::thread> threads;
      for (size_t r = 0; r < 2; ++r) {
        threads.emplace_back([&, r] {
          published[r] = publishers[r]->Publish(step, ranks[r].Tensors(), &results[r]);
        });
      }
      for (auto& t : threads) t.join();
      REQUIRE(published[0].ok());
      REQUIRE(published[1].ok());
      CHECK((results[0].committed || results[1].committed));
      CHECK((step % 4 == 0) == (results[0].anchor_bytes > 0));
      FollowResult pulled;
      REQUIRE(every->Pull(kLatestStep, &pulled).ok());
      CHECK(pulled.step == step);
      CheckHolds(*every, ranks);
      // The same memory, step after step: updated in place.
      std::vector<const void*> now;
      for (const FollowedTensor& t : every->tensors()) now.push_back(t.data);
      if (step > 0) {
        CHECK(pulled.route == "chain " + std::to_string(step - 1) + " -> " + std::to_string(step));
        CHECK(now == pointers);
        // The undo record: a BF16 value and the LEB128 gap before it (under 2^21 within a
        // piece) per changed value, far below the model.
        CHECK(pulled.changed_elements > 0);
        CHECK(pulled.undo_bytes <= 5 * pulled.changed_elements);
      }
      pointers = now;
      if (step == 2 || step == 6) {
        REQUIRE(slice->Pull(kLatestStep, &pulled).ok());
        CheckHolds(*slice, ranks, 9000, 9050, "r1.big");
        CHECK(slice->tensors().size() == 1 + 0);  // r1.big only: no groupable tensor is selected
      }
    }
    FollowResult pulled;
    REQUIRE(late->Pull(3, &pulled).ok());
    CHECK(pulled.route == "anchor 0 -> 3");
    REQUIRE(late->Pull(kLatestStep, &pulled).ok());
    CHECK(pulled.route == "chain 3 -> 6");
    CheckHolds(*late, ranks);
    REQUIRE(late->Pull(kLatestStep, &pulled).ok());
    CHECK(pulled.up_to_date);
    // A step that does not follow the last one published is refused.
    PublishResult result;
    CHECK(publishers[0]->Publish(6, ranks[0].Tensors(), &result).code() ==
          ErrorCode::kInvalidArgument);
    CHECK(publishers[0]->held_bytes() == (12000 * 256 + 256 + 1024 * 256) * 2);
  }
}

TEST_CASE(
    "roles: Follow waits for the first step, pulls each newer one as it is committed, and stops "
    "when told") {
  TempDir tmp;
  for (Backend& b : sync::test::Backends(tmp, "roles-follow")) {
    INFO("store ", b.name);
    std::vector<Rank> ranks = {Rank(0, 7), Rank(1, 8)};
    std::vector<std::unique_ptr<Publisher>> publishers = Publishers(b.url, 2, 4);
    std::unique_ptr<Follower> follower;
    REQUIRE(Follower::Open(b.url, {}, &follower).ok());
    std::map<uint64_t, std::vector<Rank>> published;  // step -> the ranks as published
    std::mutex mutex;
    std::vector<uint64_t> pulled;
    std::vector<FollowEvent::Kind> kinds;
    bool held_as_published = true;
    FollowOptions options;
    options.interval_seconds = 0.05;
    options.until = 4;
    Status followed;
    std::thread thread([&] {
      followed = follower->Follow(options, [&](const FollowEvent& e, const FollowResult* r) {
        std::lock_guard<std::mutex> lock(mutex);
        kinds.push_back(e.kind);
        if (e.kind != FollowEvent::Kind::kPulled) return true;
        // Between pulls the tensors are the step's, as its ranks published them.
        for (const Rank& rank : published.at(e.step)) {
          for (const FollowedTensor& t : follower->tensors()) {
            for (size_t i = 0; i < rank.names.size(); ++i) {
              if (t.name == rank.names[i]) {
                held_as_published =
                    held_as_published &&
                    std::memcmp(t.data, rank.values[i].data(), rank.values[i].size() * 2) == 0;
              }
            }
          }
        }
        held_as_published =
            held_as_published && r != nullptr && r->step == e.step && e.lag_seconds >= 0 &&
            (pulled.empty() ? e.steps_behind == 0 : e.steps_behind == e.step - pulled.back());
        pulled.push_back(e.step);
        return true;
      });
    });
    std::this_thread::sleep_for(std::chrono::milliseconds(300));  // it starts before any step
    std::mt19937 rng(9);
    for (uint64_t step = 0; step <= 4; ++step) {
      if (step > 0) {
        for (Rank& r : ranks) r.Step(&rng);
      }
      {
        std::lock_guard<std::mutex> lock(mutex);
        published[step] = ranks;
      }
      PublishResult result;
      for (size_t r = 0; r < 2; ++r)
        REQUIRE(publishers[r]->Publish(step, ranks[r].Tensors(), &result).ok());
    }
    thread.join();
    REQUIRE(followed.ok());
    CHECK(held_as_published);
    REQUIRE(!pulled.empty());
    CHECK(std::is_sorted(pulled.begin(), pulled.end()));
    CHECK(pulled.back() == 4);
    CHECK(follower->step() == 4);
    CHECK(std::count(kinds.begin(), kinds.end(), FollowEvent::Kind::kWaiting) == 1);
    CheckHolds(*follower, ranks);
    // A callback that says stop ends the loop after its first event; until a step held
    // returns at once; a stop request ends the wait between polls.
    std::unique_ptr<Follower> other;
    REQUIRE(Follower::Open(b.url, {}, &other).ok());
    int events = 0;
    REQUIRE(other->Follow({}, [&](const FollowEvent&, const FollowResult*) { return ++events > 1; })
                .ok());
    CHECK(events == 1);
    CHECK(other->step() == 4);
    FollowOptions held;
    held.until = 3;
    CHECK(other->Follow(held, nullptr).ok());
    FollowOptions asked;
    asked.interval_seconds = 3600;
    asked.stop_requested = [] { return true; };
    const auto start = std::chrono::steady_clock::now();
    CHECK(other->Follow(asked, nullptr).ok());
    CHECK(std::chrono::steady_clock::now() - start < std::chrono::seconds(60));
  }
}

TEST_CASE("roles: Follow gives up on a store that keeps failing, after max_failures polls") {
  TempDir tmp;
  sync::test::fs::create_directories(tmp / "gone");
  std::unique_ptr<Follower> follower;
  FollowerOptions fo;
  fo.store.retries = 1;
  REQUIRE(Follower::Open(tmp / "gone", fo, &follower).ok());
  sync::test::fs::remove_all(tmp / "gone");
  FollowOptions options;
  options.interval_seconds = 0.01;
  options.max_failures = 3;
  int retries = 0;
  const Status s = follower->Follow(options, [&](const FollowEvent& e, const FollowResult*) {
    retries += e.kind == FollowEvent::Kind::kRetrying;
    return true;
  });
  CHECK(s.code() == ErrorCode::kUnavailable);
  CHECK(retries == 2);
}

TEST_CASE(
    "roles: kLatestStep asks for the newest step; kNoStep, no step number, is refused as one") {
  TempDir tmp;
  const std::string url = tmp / "store";
  Rank rank(0, 3);
  std::unique_ptr<Publisher> publisher;
  REQUIRE(Publisher::Open(url, {}, &publisher).ok());
  CHECK(publisher->last_step() == kNoStep);
  PublishResult published;
  CHECK(publisher->Publish(kLatestStep, rank.Tensors(), &published).code() ==
        ErrorCode::kInvalidArgument);
  REQUIRE(publisher->Publish(4, rank.Tensors(), &published).ok());
  std::unique_ptr<Follower> follower;
  REQUIRE(Follower::Open(url, {}, &follower).ok());
  CHECK(follower->step() == kNoStep);
  FollowResult pulled;
  const Status none = follower->Pull(kNoStep, &pulled);
  CHECK(none.code() == ErrorCode::kInvalidArgument);
  CHECK(none.message().find("kLatestStep") != std::string::npos);
  CHECK(follower->step() == kNoStep);
  REQUIRE(follower->Pull(kLatestStep, &pulled).ok());
  CHECK(pulled.step == 4);
  CHECK(pulled.from_step == kNoStep);
  CHECK(follower->step() == 4);
}

TEST_CASE(
    "roles: a follower refuses a corrupt piece and keeps its tensors, or routes around it where it "
    "can") {
  TempDir tmp;
  for (Backend& b : sync::test::Backends(tmp, "roles-faults")) {
    INFO("store ", b.name);
    Rank rank(0, 3);
    std::unique_ptr<Publisher> publisher;
    REQUIRE(Publisher::Open(b.url, {}, &publisher).ok());
    std::unique_ptr<Follower> follower;
    REQUIRE(Follower::Open(b.url, {}, &follower).ok());
    std::mt19937 rng(1);
    PublishResult published;
    REQUIRE(publisher->Publish(0, rank.Tensors(), &published).ok());
    FollowResult pulled;
    REQUIRE(follower->Pull(kLatestStep, &pulled).ok());
    const std::vector<uint16_t> before = rank.values[0];
    rank.Step(&rng);
    REQUIRE(publisher->Publish(1, rank.Tensors(), &published).ok());
    // Damage the step's delta object in the store.
    const auto [key, bytes] = DamageDelta(b.store.get(), 1, 0);
    const Status s = follower->Pull(kLatestStep, &pulled);
    CHECK(s.code() == ErrorCode::kCorruptChunk);
    CHECK(follower->step() == 0);
    const FollowedTensor t = follower->tensors()[0];
    CHECK(std::memcmp(t.data, before.data(), before.size() * 2) == 0);
    REQUIRE(b.store->Put(key, bytes.data(), bytes.size(), sync::PutMode::kOverwrite).ok());
    REQUIRE(follower->Pull(kLatestStep, &pulled).ok());
    CheckHolds(*follower, {rank});
    // Step 10 carries an anchor too: a damaged delta there is routed around, and said so.
    for (uint64_t step = 2; step <= 10; ++step) {
      rank.Step(&rng);
      REQUIRE(publisher->Publish(step, rank.Tensors(), &published).ok());
      if (step == 8) REQUIRE(follower->Pull(kLatestStep, &pulled).ok());
    }
    sync::StepManifest m;
    REQUIRE(sync::ReadManifest(b.store.get(), 10, &m, nullptr).ok());
    REQUIRE(m.anchor());
    DamageDelta(b.store.get(), 10, 0);
    REQUIRE(follower->Pull(kLatestStep, &pulled).ok());
    INFO("rerouted: ", pulled.rerouted);
    CHECK(pulled.route == "anchor 10 -> 10");
    CHECK(pulled.rerouted.find("took anchor 10 -> 10 instead of chain 8 -> 10") !=
          std::string::npos);
    CHECK(follower->step() == 10);
    CheckHolds(*follower, {rank});
  }
}

TEST_CASE("roles: a follower whose anchor route fails below the step it held keeps that step") {
  TempDir tmp;
  for (Backend& b : sync::test::Backends(tmp, "roles-never-older")) {
    INFO("store ", b.name);
    Rank rank(0, 5);
    std::unique_ptr<Publisher> publisher;
    PublisherOptions po;
    po.anchor_every = 0;  // one anchor, at step 0: the anchor route replays every step
    REQUIRE(Publisher::Open(b.url, po, &publisher).ok());
    std::unique_ptr<Follower> follower;
    REQUIRE(Follower::Open(b.url, {}, &follower).ok());
    std::mt19937 rng(2);
    PublishResult published;
    FollowResult pulled;
    std::vector<Rank> at5;
    for (uint64_t step = 0; step <= 6; ++step) {
      if (step > 0) rank.Step(&rng);
      REQUIRE(publisher->Publish(step, rank.Tensors(), &published).ok());
      if (step == 5) {
        REQUIRE(follower->Pull(kLatestStep, &pulled).ok());
        at5 = {rank};
      }
    }
    REQUIRE(follower->step() == 5);
    // The chain 5 -> 6 fails at 6; the anchor route 0 -> 6 it takes instead fails at 2.
    const auto [key6, bytes6] = DamageDelta(b.store.get(), 6, 0);
    const auto [key2, bytes2] = DamageDelta(b.store.get(), 2, 0);
    const Status s = follower->Pull(kLatestStep, &pulled);
    CHECK(s.code() == ErrorCode::kCorruptChunk);
    CHECK(follower->step() == 5);
    CheckHolds(*follower, at5);
    // With step 2 repaired, both routes still fail at step 6: the follower keeps step 5.
    REQUIRE(b.store->Put(key2, bytes2.data(), bytes2.size(), sync::PutMode::kOverwrite).ok());
    const Status again = follower->Pull(kLatestStep, &pulled);
    CHECK(again.code() == ErrorCode::kCorruptChunk);
    CHECK(follower->step() == 5);
    REQUIRE(b.store->Put(key6, bytes6.data(), bytes6.size(), sync::PutMode::kOverwrite).ok());
    REQUIRE(follower->Pull(kLatestStep, &pulled).ok());
    CHECK(follower->step() == 6);
    CheckHolds(*follower, {rank});
  }
}

TEST_CASE(
    "roles: a step whose second shard is damaged changes no tensor of the first, fetched ahead or "
    "not") {
  TempDir tmp;
  for (Backend& b : sync::test::Backends(tmp, "roles-undo")) {
    INFO("store ", b.name);
    std::vector<Rank> ranks = {Rank(0, 5), Rank(1, 6)};
    std::vector<std::unique_ptr<Publisher>> publishers = Publishers(b.url, 2, 10);
    std::mt19937 rng(2);
    const auto publish = [&](uint64_t step) {
      for (uint32_t r = 0; r < 2; ++r) {
        PublishResult result;
        REQUIRE(publishers[r]->Publish(step, ranks[r].Tensors(), &result).ok());
      }
    };
    publish(0);
    // Batches of one shard, each read piece by piece (nothing fits the bound), and the default.
    std::vector<std::unique_ptr<Follower>> followers(2);
    for (size_t i = 0; i < 2; ++i) {
      FollowerOptions o;
      o.threads = 2;
      if (i == 0) o.fetch_ahead_bytes = 1;
      REQUIRE(Follower::Open(b.url, o, &followers[i]).ok());
      FollowResult pulled;
      REQUIRE(followers[i]->Pull(kLatestStep, &pulled).ok());
    }
    const std::vector<Rank> before = ranks;
    for (Rank& r : ranks) r.Step(&rng);
    publish(1);
    const auto [key, bytes] = DamageDelta(b.store.get(), 1, 1);
    for (size_t i = 0; i < 2; ++i) {
      INFO("follower ", i);
      FollowResult pulled;
      const Status s = followers[i]->Pull(kLatestStep, &pulled);
      CHECK(s.code() == ErrorCode::kCorruptChunk);
      CHECK(s.message().find("shard 1") != std::string::npos);
      CHECK(followers[i]->step() == 0);
      CheckHolds(*followers[i], before);  // shard 0's pieces were written, then undone
    }
    REQUIRE(b.store->Put(key, bytes.data(), bytes.size(), sync::PutMode::kOverwrite).ok());
    for (size_t i = 0; i < 2; ++i) {
      FollowResult pulled;
      REQUIRE(followers[i]->Pull(kLatestStep, &pulled).ok());
      CHECK(pulled.route == "chain 0 -> 1");
      CheckHolds(*followers[i], ranks);
    }
  }
}

}  // namespace
}  // namespace arc_v3
