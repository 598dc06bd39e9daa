// RematPolicy: the named policies, the list form, and errors that list the
// valid region names.
#include <gtest/gtest.h>

#include "tiermoe/remat/policy.h"

namespace tiermoe {
namespace {

// The kinds each named policy keeps, written out (not derived from the table).
TEST(RematPolicy, NamedPoliciesKeepTheDocumentedRegions) {
  struct Case {
    const char* policy;
    std::vector<std::string> kept;
  };
  const std::vector<std::string> all = {"router", "dispatch", "w13",       "act",  "w2",
                                        "combine", "shared",  "attention", "norm", "mlp"};
  for (const Case& c : {
           Case{"none", all},
           Case{"full", {"router", "combine"}},
           Case{"default", {"router", "w13", "act", "w2", "combine", "shared", "attention", "mlp"}},
           Case{"save-w2-only", {"router", "w2", "combine"}},
           Case{"save:w13,w2", {"router", "w13", "w2", "combine"}},
           Case{"save:dispatch", {"router", "dispatch", "combine"}},
           Case{"save:attention,norm", {"router", "combine", "attention", "norm"}},
       }) {
    RematPolicy p = RematPolicy::parse(c.policy);
    for (const std::string& kind : all) {
      bool want = std::find(c.kept.begin(), c.kept.end(), kind) != c.kept.end();
      EXPECT_EQ(p.saves(kind), want) << c.policy << " " << kind;
    }
  }
}

TEST(RematPolicy, CanonicalNamesAndFullRegionNames) {
  EXPECT_EQ(RematPolicy::parse("default").name(), "default");
  EXPECT_EQ(RematPolicy().name(), "none");
  // Table order, duplicates and never-replayed kinds dropped from the name.
  EXPECT_EQ(RematPolicy::parse("save:w2,w13,combine,w2").name(), "save:w13,w2");
  EXPECT_EQ(RematPolicy::parse("save:router,combine").name(), "full");
  RematPolicy p = RematPolicy::parse("save:act");
  EXPECT_TRUE(p.saves("model.layers.3.mlp.act"));
  EXPECT_FALSE(p.saves("model.layers.3.mlp.w13"));
  EXPECT_TRUE(p.saves(MoeRegion::combine));
  EXPECT_FALSE(p.saves(MoeRegion::dispatch));
}

TEST(RematPolicy, MoeKeepFollowsThePolicy) {
  MoeRegionKeep keep = RematPolicy::parse("save:w13,shared").moe_keep();
  EXPECT_TRUE(keep[MoeRegion::w13]);
  EXPECT_TRUE(keep[MoeRegion::shared]);
  EXPECT_FALSE(keep[MoeRegion::dispatch]);
  EXPECT_FALSE(keep[MoeRegion::act]);
  EXPECT_FALSE(keep[MoeRegion::w2]);
  // Router and combine keep whatever is asked of them.
  EXPECT_TRUE(keep[MoeRegion::router]);
  EXPECT_TRUE(keep[MoeRegion::combine]);
  MoeRegionKeep none = MoeRegionKeep::none();
  EXPECT_TRUE(none[MoeRegion::combine]);
  EXPECT_FALSE(none[MoeRegion::w13]);
}

// The message names the bad region and lists every valid one.
TEST(RematPolicy, UnknownRegionIsAnErrorListingTheValidNames) {
  for (const char* bad : {"save:w13,w3", "save:W2", "save:moe"}) {
    try {
      RematPolicy::parse(bad);
      ADD_FAILURE() << bad << " was accepted";
    } catch (const Error& e) {
      const std::string msg = std::string(e.what()) + " " + e.hint();
      EXPECT_NE(msg.find("unknown remat region"), std::string::npos) << msg;
      for (const auto& k : remat_region_kinds()) {
        EXPECT_NE(e.hint().find(std::string(k.name)), std::string::npos) << k.name << ": " << msg;
      }
      EXPECT_EQ(e.where(), "--remat");
    }
  }
  EXPECT_THROW(RematPolicy::none().saves("w3"), Error);
}

TEST(RematPolicy, MalformedPolicyIsAClearError) {
  for (const char* bad : {"", "sometimes", "save", "save:", "save:w13,", "save:,w2", "save:w13,,w2",
                          "Full", "save: w13"}) {
    try {
      RematPolicy::parse(bad, "train --remat");
      ADD_FAILURE() << "'" << bad << "' was accepted";
    } catch (const Error& e) {
      EXPECT_EQ(e.where(), "train --remat") << bad;
      EXPECT_FALSE(e.hint().empty()) << bad;
    }
  }
}

}  // namespace
}  // namespace tiermoe
