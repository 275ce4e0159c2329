# One image for every tooltx process (provisioner, services, the sample KB).
# The full image: better-sqlite3 builds from source when its prebuilt binary cannot be fetched.
FROM node:20-bookworm
WORKDIR /app
COPY package.json package-lock.json ./
COPY libs ./libs
COPY streams ./streams
COPY dev ./dev
RUN npm ci --no-audit --no-fund
COPY . .
ENV NODE_ENV=production
RUN mkdir -p /data && chown node:node /data
USER node
