// Deadline queue: earliest deadline first, equal deadlines in the order they
// were set; move, cancel and pop keep the heap consistent (checked against a
// reference model under random operations).
#include <gtest/gtest.h>

#include <algorithm>
#include <cstddef>
#include <cstdint>
#include <random>
#include <set>
#include <tuple>
#include <vector>

extern "C" {
#include "timerq.h"
}

namespace {

// A user object embedding a timer, as the engine would.
struct Item {
    int         id;
    kvc_timer_t timer;
};

// The id of the item holding t; -1 for NULL (a failure, not a crash).
int id_of(kvc_timer_t *t)
{
    if (t == nullptr) {
        return -1;
    }
    return reinterpret_cast<Item *>(reinterpret_cast<char *>(t) -
                                    offsetof(Item, timer))
        ->id;
}

class TimerQ : public ::testing::Test {
  protected:
    void SetUp() override { kvc_timerq_init(&q_); }
    void TearDown() override { kvc_timerq_fini(&q_); }

    std::vector<Item> make_items(size_t n)
    {
        std::vector<Item> v(n);
        for (size_t i = 0; i < n; i++) {
            v[i].id    = static_cast<int>(i);
            v[i].timer = kvc_timer_t{};
        }
        return v;
    }

    void set(Item &it, uint64_t deadline)
    {
        ASSERT_EQ(KVX_OK, kvc_timerq_set(&q_, &it.timer, deadline));
    }

    // Pops everything (now = max) and returns the ids in pop order.
    std::vector<int> drain()
    {
        std::vector<int> ids;
        kvc_timer_t     *t;
        while ((t = kvc_timerq_pop_due(&q_, UINT64_MAX)) != nullptr) {
            EXPECT_FALSE(kvc_timer_queued(t));
            ids.push_back(id_of(t));
        }
        EXPECT_EQ(0u, kvc_timerq_size(&q_));
        return ids;
    }

    kvc_timerq_t q_;
};

} // namespace

TEST_F(TimerQ, EmptyQueue)
{
    EXPECT_EQ(0u, kvc_timerq_size(&q_));
    EXPECT_EQ(nullptr, kvc_timerq_peek(&q_));
    EXPECT_EQ(nullptr, kvc_timerq_pop_due(&q_, UINT64_MAX));
    kvc_timer_t t = {};
    EXPECT_FALSE(kvc_timer_queued(&t));
}

TEST_F(TimerQ, PopsInDeadlineOrder)
{
    auto           items       = make_items(8);
    const uint64_t deadlines[] = {50, 10, 70, 30, 80, 20, 60, 40};
    for (size_t i = 0; i < items.size(); i++) {
        set(items[i], deadlines[i]);
        EXPECT_TRUE(kvc_timer_queued(&items[i].timer));
    }
    EXPECT_EQ(8u, kvc_timerq_size(&q_));
    EXPECT_EQ(1, id_of(kvc_timerq_peek(&q_)));

    // Not due yet: nothing comes out and nothing is removed.
    EXPECT_EQ(nullptr, kvc_timerq_pop_due(&q_, 9));
    EXPECT_EQ(8u, kvc_timerq_size(&q_));

    // Deadline == now is due.
    EXPECT_EQ(1, id_of(kvc_timerq_pop_due(&q_, 10)));
    EXPECT_EQ(nullptr, kvc_timerq_pop_due(&q_, 19));
    EXPECT_EQ(5, id_of(kvc_timerq_pop_due(&q_, 45)));
    EXPECT_EQ(3, id_of(kvc_timerq_pop_due(&q_, 45)));
    EXPECT_EQ(7, id_of(kvc_timerq_pop_due(&q_, 45)));
    EXPECT_EQ(nullptr, kvc_timerq_pop_due(&q_, 45));
    EXPECT_EQ((std::vector<int>{0, 6, 2, 4}), drain());
}

TEST_F(TimerQ, TiesPopInInsertionOrder)
{
    auto items = make_items(10);
    // Interleave two deadlines; within each, the set order must hold.
    for (size_t i = 0; i < items.size(); i++) {
        set(items[i], i % 2 ? 100 : 200);
    }
    EXPECT_EQ((std::vector<int>{1, 3, 5, 7, 9, 0, 2, 4, 6, 8}), drain());

    // Reverse set order gives reverse pop order at one deadline.
    for (size_t i = items.size(); i-- > 0;) {
        set(items[i], 5);
    }
    EXPECT_EQ((std::vector<int>{9, 8, 7, 6, 5, 4, 3, 2, 1, 0}), drain());
}

TEST_F(TimerQ, MoveEarlierAndLater)
{
    auto items = make_items(5);
    for (size_t i = 0; i < items.size(); i++) {
        set(items[i], 100 * (i + 1)); // 100..500
    }
    set(items[4], 50); // last -> first
    EXPECT_EQ(4, id_of(kvc_timerq_peek(&q_)));
    set(items[4], 1000); // first -> last
    EXPECT_EQ(0, id_of(kvc_timerq_peek(&q_)));
    set(items[0], 350); // root -> middle
    EXPECT_EQ(5u, kvc_timerq_size(&q_));
    EXPECT_EQ(1000u, items[4].timer.deadline_us);
    EXPECT_EQ((std::vector<int>{1, 2, 0, 3, 4}), drain());
}

TEST_F(TimerQ, MoveToSameDeadlineGoesBehindPeers)
{
    auto items = make_items(3);
    set(items[0], 10);
    set(items[1], 10);
    set(items[2], 10);
    set(items[0], 10); // re-set: now the newest at 10
    EXPECT_EQ((std::vector<int>{1, 2, 0}), drain());
}

TEST_F(TimerQ, CancelMiddleLastAndRoot)
{
    auto items = make_items(15);
    for (size_t i = 0; i < items.size(); i++) {
        set(items[i], 10 * (i + 1)); // inserted ascending: slot == id
    }
    // Slot 14 is the last slot.
    ASSERT_EQ(15u, items[14].timer.index);
    kvc_timerq_cancel(&q_, &items[14].timer);
    EXPECT_FALSE(kvc_timer_queued(&items[14].timer));
    // Middle (slot 4, which has children).
    ASSERT_EQ(5u, items[4].timer.index);
    kvc_timerq_cancel(&q_, &items[4].timer);
    EXPECT_FALSE(kvc_timer_queued(&items[4].timer));
    // Root.
    ASSERT_EQ(1u, items[0].timer.index);
    kvc_timerq_cancel(&q_, &items[0].timer);
    EXPECT_FALSE(kvc_timer_queued(&items[0].timer));
    EXPECT_EQ(12u, kvc_timerq_size(&q_));
    EXPECT_EQ(1, id_of(kvc_timerq_peek(&q_)));
    EXPECT_EQ((std::vector<int>{1, 2, 3, 5, 6, 7, 8, 9, 10, 11, 12, 13}),
              drain());
}

TEST_F(TimerQ, CancelNeedsSiftUp)
{
    // The last timer moved into a cancelled slot can be earlier than that
    // slot's parent (it came from another subtree): it must go up.
    auto           items = make_items(7);
    const uint64_t d[]   = {0, 100, 1, 101, 102, 50, 3};
    for (size_t i = 0; i < items.size(); i++) {
        set(items[i], d[i]);
    }
    // Inserted so that slot == id. Without the sift-up, id6 (3) would stay
    // under id1 (100) and id5 (50) would pop before it.
    for (size_t i = 0; i < items.size(); i++) {
        ASSERT_EQ(i + 1, items[i].timer.index);
    }
    kvc_timerq_cancel(&q_, &items[3].timer); // id6 (3) lands under id1 (100)
    EXPECT_EQ(2u, items[6].timer.index);      // ...and moved up into slot 1
    EXPECT_EQ((std::vector<int>{0, 2, 6, 5, 1, 4}), drain());
}

TEST_F(TimerQ, CancelNotQueuedIsNoOp)
{
    auto items = make_items(3);
    kvc_timerq_cancel(&q_, &items[0].timer); // never set, empty queue
    set(items[1], 5);
    set(items[2], 7);
    kvc_timerq_cancel(&q_, &items[0].timer); // never set
    EXPECT_EQ(2u, kvc_timerq_size(&q_));
    kvc_timerq_cancel(&q_, &items[1].timer);
    kvc_timerq_cancel(&q_, &items[1].timer); // twice
    EXPECT_EQ(1u, kvc_timerq_size(&q_));
    EXPECT_EQ((std::vector<int>{2}), drain());
    kvc_timerq_cancel(&q_, &items[2].timer); // after pop
    EXPECT_EQ(0u, kvc_timerq_size(&q_));
}

TEST_F(TimerQ, ReSetAfterPop)
{
    auto items = make_items(2);
    set(items[0], 10);
    set(items[1], 20);
    kvc_timer_t *t = kvc_timerq_pop_due(&q_, 10);
    ASSERT_EQ(&items[0].timer, t);
    EXPECT_FALSE(kvc_timer_queued(t));
    set(items[0], 30);
    EXPECT_TRUE(kvc_timer_queued(&items[0].timer));
    EXPECT_EQ(2u, kvc_timerq_size(&q_));
    EXPECT_EQ((std::vector<int>{1, 0}), drain());
    set(items[0], 1); // and after a drain
    EXPECT_EQ((std::vector<int>{0}), drain());
}

TEST_F(TimerQ, FiniThenReuse)
{
    auto items = make_items(40); // forces several growths
    for (size_t i = 0; i < items.size(); i++) {
        set(items[i], 40 - i);
    }
    EXPECT_EQ(39, id_of(kvc_timerq_peek(&q_)));
    drain();
    kvc_timerq_fini(&q_);
    EXPECT_EQ(0u, kvc_timerq_size(&q_));
    EXPECT_EQ(nullptr, kvc_timerq_peek(&q_));
    kvc_timerq_init(&q_);
    set(items[3], 1);
    EXPECT_EQ((std::vector<int>{3}), drain());
}

// Random set / move / cancel / pop_due against a reference model: a sorted
// set of (deadline, set order, id). Deadlines fall within 512 us of a clock
// that creeps forward, so ties are common and a few hundred timers stay
// queued; any slip in sift-up or sift-down after a removal or a
// move makes the pop order diverge from the model.
TEST_F(TimerQ, RandomAgainstModel)
{
    using Key                 = std::tuple<uint64_t, uint64_t, int>;
    constexpr size_t  kTimers = 1000;
    constexpr size_t  kOps    = 200000;
    std::set<Key>     model; // (deadline, model's own set counter, id)
    std::vector<Key>  key_of(kTimers);
    std::vector<bool> in_model(kTimers, false);
    uint64_t          order = 0;
    uint64_t          now   = 0;
    std::mt19937_64   rng(20240601); // fixed seed: the run is reproducible
    auto              items = make_items(kTimers);
    size_t            pops = 0, cancels = 0, moves = 0;

    auto model_remove = [&](int id) {
        model.erase(key_of[id]);
        in_model[id] = false;
    };

    for (size_t op = 0; op < kOps; op++) {
        const int      id   = static_cast<int>(rng() % kTimers);
        const unsigned kind = static_cast<unsigned>(rng() % 100);
        Item          &it   = items[id];

        if (kind < 45) { // set: insert or move
            const uint64_t deadline = now + rng() % 512;
            if (in_model[id]) {
                model_remove(id);
                moves++;
            }
            ASSERT_EQ(KVX_OK, kvc_timerq_set(&q_, &it.timer, deadline));
            key_of[id] = Key(deadline, order++, id);
            model.insert(key_of[id]);
            in_model[id] = true;
        } else if (kind < 65) { // cancel (queued or not)
            if (in_model[id]) {
                model_remove(id);
                cancels++;
            }
            kvc_timerq_cancel(&q_, &it.timer);
        } else { // advance time a little and pop what is due
            now += rng() % 2;
            for (;;) {
                kvc_timer_t *t = kvc_timerq_pop_due(&q_, now);
                if (model.empty() || std::get<0>(*model.begin()) > now) {
                    ASSERT_EQ(nullptr, t) << "op " << op;
                    break;
                }
                ASSERT_NE(nullptr, t) << "op " << op;
                const int want = std::get<2>(*model.begin());
                ASSERT_EQ(want, id_of(t)) << "op " << op;
                ASSERT_EQ(std::get<0>(*model.begin()), t->deadline_us);
                ASSERT_FALSE(kvc_timer_queued(t));
                model_remove(want);
                pops++;
            }
        }

        ASSERT_EQ(model.size(), kvc_timerq_size(&q_)) << "op " << op;
        ASSERT_EQ(in_model[id], kvc_timer_queued(&it.timer) != 0);
        kvc_timer_t *head = kvc_timerq_peek(&q_);
        if (model.empty()) {
            ASSERT_EQ(nullptr, head);
        } else {
            ASSERT_NE(nullptr, head);
            ASSERT_EQ(std::get<2>(*model.begin()), id_of(head))
                << "op " << op;
        }
    }

    // The run exercised every path, then the rest drains in model order.
    EXPECT_GT(pops, 10000u);
    EXPECT_GT(cancels, 10000u);
    EXPECT_GT(moves, 10000u);
    std::vector<int> want;
    for (const Key &k : model) {
        want.push_back(std::get<2>(k));
    }
    EXPECT_EQ(want, drain());
}

// 100,000 queued timers, none due: pop_due looks at the root only, returns
// NULL and leaves the queue as it was. Then they come out in order.
TEST_F(TimerQ, ManyQueuedNoneDue)
{
    constexpr size_t kTimers = 100000;
    auto             items   = make_items(kTimers);
    std::mt19937_64  rng(7);
    uint64_t         min_deadline = UINT64_MAX;

    for (size_t i = 0; i < kTimers; i++) {
        const uint64_t d = 1000000 + rng() % 1000000;
        min_deadline     = std::min(min_deadline, d);
        set(items[i], d);
    }
    ASSERT_EQ(kTimers, kvc_timerq_size(&q_));
    for (int i = 0; i < 1000; i++) {
        ASSERT_EQ(nullptr, kvc_timerq_pop_due(&q_, 999999));
    }
    ASSERT_EQ(kTimers, kvc_timerq_size(&q_));
    ASSERT_NE(nullptr, kvc_timerq_peek(&q_));
    EXPECT_EQ(min_deadline, kvc_timerq_peek(&q_)->deadline_us);

    uint64_t last = 0;
    size_t   n    = 0;
    while (kvc_timer_t *t = kvc_timerq_pop_due(&q_, UINT64_MAX)) {
        ASSERT_LE(last, t->deadline_us);
        last = t->deadline_us;
        n++;
    }
    EXPECT_EQ(kTimers, n);
}
