// Data identities and positions in training checkpoints (NOTE [Data identity] and NOTE
// [Data position] in integration/train_module.h): how a resume compares what a checkpoint
// recorded with what its module gives, and how a difference reads.
//
//   const integration::DataIdentityComparison data =
//       integration::CompareDataIdentity(loaded.data_identity, module.DataIdentity());
//   for (const integration::DataIdentityChange& c : data.changes) LOG(WARNING) << c.ToString();
//   // "data.seed: the checkpoint's 2 vs this module's 3"
#ifndef INTEGRATION_CHECKPOINTING_DATA_IDENTITY_H_
#define INTEGRATION_CHECKPOINTING_DATA_IDENTITY_H_

#include <map>
#include <optional>
#include <string>
#include <vector>

namespace integration {

// One key of the identity that differs between the checkpoint and the module.
struct DataIdentityChange {
  std::string key;
  std::optional<std::string> saved;    // the checkpoint's value; nullopt: it lacks the key
  std::optional<std::string> current;  // the module's value; nullopt: it lacks the key
  // "data.fingerprint: the checkpoint's 0x1f... vs this module's 0x2c...". A side without
  // the key reads "(none)"; a value longer than 96 characters is shown only around its
  // first difference from the other side, with its length.
  std::string ToString() const;
};

struct DataIdentityComparison {
  // Both sides have an identity and were compared.
  bool compared = false;
  // Every key whose value differs or that only one side has, in key order (compared only).
  std::vector<DataIdentityChange> changes;
  // When exactly one side has an identity: why nothing was compared. "" otherwise.
  std::string note;
};

// Compares a checkpoint's recorded identity (`saved`) with a module's (`current`). An
// empty identity describes nothing: the checkpoint was saved before checkpoints kept one
// (or from a module that gives none), or the module gives none. Then nothing is compared,
// and the note says which side had none.
DataIdentityComparison CompareDataIdentity(const std::map<std::string, std::string>& saved,
                                           const std::map<std::string, std::string>& current);

// The same for NOTE [Data position] (integration/train_module.h): a checkpoint's recorded
// position with the module's DataPosition() at the checkpoint's step, key by key; the note
// names the position.
DataIdentityComparison CompareDataPosition(const std::map<std::string, std::string>& saved,
                                           const std::map<std::string, std::string>& current);

}  // namespace integration

#endif  // INTEGRATION_CHECKPOINTING_DATA_IDENTITY_H_
