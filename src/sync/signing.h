// Signed steps' cryptography (src/sync/SIGNED_STEPS.md, "Signed steps"), all of it OpenSSL's
// libcrypto: Ed25519 keys in PEM files (PKCS#8 private, SubjectPublicKeyInfo public: the
// files `openssl genpkey -algorithm ed25519` and `openssl pkey -pubout` write), SHA-256
// digests, and DSSE envelopes (the signature wrapper of in-toto and OpenSSF model signing).
#ifndef ARC_V3_SRC_SYNC_SIGNING_H_
#define ARC_V3_SRC_SYNC_SIGNING_H_

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "arc_v3.hpp"

namespace arc_v3 {
namespace sync {

using Digest = std::array<uint8_t, 32>;  // SHA-256

Digest Sha256(const void* data, size_t size);
inline Digest Sha256(const std::string& bytes) { return Sha256(bytes.data(), bytes.size()); }
// SHA-256 over bytes given in parts (a large object as it streams).
class Sha256Stream {
 public:
  Sha256Stream();
  ~Sha256Stream();
  Sha256Stream(const Sha256Stream&) = delete;
  Sha256Stream& operator=(const Sha256Stream&) = delete;
  void Update(const void* data, size_t size);
  Digest Final();

 private:
  void* ctx_;  // EVP_MD_CTX
};
std::string DigestHex(const Digest& digest);  // 64 lowercase hex digits
// 64 lowercase hex digits; false otherwise.
bool ParseDigestHex(const std::string& hex, Digest* digest);

// A key's id, what signatures name: the SHA-256 of its SubjectPublicKeyInfo (DER) in hex,
// as DSSE's reference implementations compute it.
class PublicKey {
 public:
  // Every key of a PEM file of public keys (a trust file: one or more "PUBLIC KEY" blocks,
  // nothing but whitespace around them). Errors: kInvalidArgument naming the file and what
  // to give instead (unreadable, no key, text outside a block, a private or encrypted key,
  // not Ed25519).
  static Status LoadAll(const std::string& path, std::vector<PublicKey>* keys);
  static Status AllFromPem(const std::string& pem, const std::string& name,
                           std::vector<PublicKey>* keys);
  // The same, for text holding exactly one public key.
  static Status FromPem(const std::string& pem, const std::string& name, PublicKey* key);
  const std::string& id() const { return id_; }
  // Whether `signature` is this key's Ed25519 signature of `message`.
  bool Verify(const std::string& message, const std::string& signature) const;

 private:
  std::shared_ptr<void> key_;  // EVP_PKEY
  std::string id_;
  friend class SigningKey;
};

class SigningKey {
 public:
  static Status Generate(SigningKey* key);
  // A PEM file holding one unencrypted PKCS#8 Ed25519 private key and nothing else (never
  // asks for a passphrase). Errors: kInvalidArgument naming the file and what to give.
  static Status Load(const std::string& path, SigningKey* key);
  // Writes `path` (the private key, mode 0600) and `path`.pub; neither may exist
  // (kAlreadyExists), and on error neither is left.
  Status Write(const std::string& path) const;
  const std::string& id() const { return public_.id(); }
  const PublicKey& public_key() const { return public_; }
  std::string PublicPem() const;
  // The Ed25519 signature (64 bytes) of `message`.
  Status Sign(const std::string& message, std::string* signature) const;

 private:
  std::shared_ptr<void> key_;  // EVP_PKEY
  PublicKey public_;
};

// Base64 (RFC 4648, standard alphabet, padded).
std::string Base64(const std::string& bytes);
bool ParseBase64(const std::string& text, std::string* bytes);

// DSSE (github.com/secure-systems-lab/dsse, v1): an envelope
// {"payload": BASE64, "payloadType": TYPE, "signatures": [{"keyid": ID, "sig": BASE64}]}
// whose signatures cover PAE(TYPE, payload) =
// "DSSEv1" SP LEN(TYPE) SP TYPE SP LEN(payload) SP payload.
std::string Pae(const std::string& type, const std::string& payload);
Status SignEnvelope(const SigningKey& key, const std::string& type, const std::string& payload,
                    std::string* envelope);

struct Envelope {
  std::string type, payload;
  struct Signature {
    std::string keyid, sig;  // sig decoded
  };
  std::vector<Signature> signatures;
};
// Whether `bytes` hold a DSSE envelope rather than a plain document: a JSON object whose
// first field is "payload" or "payloadType" (the protocol's documents open with "format").
bool LooksLikeEnvelope(const std::string& bytes);
// Parses an envelope strictly (kCorruptHeader naming `where`: not JSON, unknown or missing
// fields, bad base64, no signature, more than 16).
Status ParseEnvelope(const std::string& bytes, const std::string& where, Envelope* envelope);
// The id of the first key of `trusted` whose signature over the envelope verifies (a
// signature naming a keyid is tried only against that key), or kUntrusted saying what
// was found: no signature by a trusted key (naming the keyids), or a signature that does
// not verify. The envelope's type must be `type` (kUntrusted otherwise).
Status VerifyEnvelope(const Envelope& envelope, const std::string& type,
                      const std::vector<PublicKey>& trusted, const std::string& where,
                      std::string* keyid);

}  // namespace sync
}  // namespace arc_v3

#endif  // ARC_V3_SRC_SYNC_SIGNING_H_
