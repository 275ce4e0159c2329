import { generateReceiptKey, receiptSigner, trustedReceiptKeys } from '@tooltx/lifecycle';

/** A receipt signing key for histories built in-process by tests (the services use their own). */
const key = generateReceiptKey();
export const TEST_SIGNER = receiptSigner(key.privatePem);
export const TEST_TRUSTED = trustedReceiptKeys({ [key.keyId]: key.publicPem });
